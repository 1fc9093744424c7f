"""The `lora` weight-sync backend against fake vLLM servers: the adapter directory it writes, the same keep-mode
pause, version label and resume around `/v1/load_lora_adapter` (in place, under the served name), a server
that does not load adapters failing with the hint, re-syncs; and the config choosing it."""
from __future__ import annotations

import pytest
import torch

from tests.unit.fake_vllm import FakeVllm
from turnstream.core.config import load_config
from turnstream.core.config_lora import LoraSection
from turnstream.learner.sync.base import WeightSyncError
from turnstream.learner.sync.disk import DiskWeightSync
from turnstream.learner.sync.factory import weight_sync_from_config
from turnstream.learner.sync.lora import LoraAdapterSync
from turnstream.learner.weights.buckets import WeightBuckets

SEQUENCE = ["pause?mode=keep&clear_cache=false", "load_lora_adapter", "update_weight_version", "resume"]
LORA = LoraSection(rank=2, alpha=4.0, target_modules=["q_proj"])


@pytest.fixture
async def servers():
    fakes = [await FakeVllm(name).start() for name in ("a", "b")]
    yield fakes
    for f in fakes:
        await f.stop()


def _adapters() -> dict:
    """Adapter tensors under the model's names, beside a base weight that must be left out."""
    name = "model.layers.0.self_attn.q_proj"
    return {f"{name}.base_layer.weight": torch.ones(4, 4), f"{name}.lora_A.default.weight": torch.ones(2, 4),
            f"{name}.lora_B.default.weight": torch.zeros(4, 2)}


async def test_push_loads_the_adapter_in_place_between_pause_and_resume(servers, tmp_path):
    from safetensors.torch import load_file

    sync = LoraAdapterSync([f.url for f in servers], tmp_path / "w", LORA, tmp_path, keep=1)
    for version in (1, 2, 3):
        path = sync.save(WeightBuckets(_adapters(), None), version)
        await sync.push(path, version)
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["v000002", "v000003"]  # keep=1
    assert set(load_file(path / "adapter_model.safetensors")) == {
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"}  # the base is never pushed
    for f in servers:
        assert [name for name, _ in f.calls] == SEQUENCE * 3 and f.version == "3"
        assert f.calls[-3][1] == {"lora_name": "policy-lora", "lora_path": str(path), "load_inplace": True}


async def test_a_server_without_runtime_adapters_fails_with_the_hint_and_is_resynced(servers, tmp_path):
    a, b = servers
    a.lora_loading = False
    sync = LoraAdapterSync([a.url, b.url], tmp_path / "w", LORA, tmp_path)
    with pytest.raises(WeightSyncError, match="HTTP 404.*learner.lora.push = \"merged\""):
        await sync.push(sync.save(WeightBuckets(_adapters(), None), 1), 1)
    assert [name for name, _ in a.calls][-1] == "resume" and b.version == "1" and sync.behind() == [a.url]
    a.lora_loading = True  # e.g. restarted with the flags
    assert await sync.resync() == [a.url] and a.version == "1"


def test_config_chooses_the_lora_backend_for_adapter_pushes_only(tmp_path):
    base = ["vllm.urls=['http://127.0.0.1:9']", f"model.path='{tmp_path}'", "learner.lora.rank=4"]
    sync = weight_sync_from_config(load_config(None, base), tmp_path / "weights")
    assert isinstance(sync, LoraAdapterSync) and sync.lora.rank == 4 and sync.dir == (tmp_path / "weights").resolve()
    merged = weight_sync_from_config(load_config(None, [*base, "learner.lora.push='merged'"]), tmp_path / "weights")
    assert isinstance(merged, DiskWeightSync)  # full weights through the configured backend
