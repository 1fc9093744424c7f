"""Live horizontal scaling: actors join and leave a running buffer + learner; nothing restarts, the
stopped actor's unfinished episodes expire in the buffer (counted as abandoned).

Which episodes the buffer holds open for an actor is read from the buffer's audit trail
(core/audit.py): an actor waiting for credit may hold none, and killing it then would test nothing."""
from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import pytest

from tests.fault.ledger import Ledger
from tests.helpers import poll_until, scrape

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]


def _wait(predicate, timeout_s: float, what: str, procs) -> None:
    from turnstream.launch.processes import tail

    def logs() -> str:
        return "\n".join(f"--- {c.name}\n{tail(c.log_path, 15)}" for c in procs.children)

    poll_until(predicate, what, timeout_s, context=logs, interval_s=0.5)


def _value(url: str, key: str) -> float:
    return scrape(url).get(key, 0.0)


def _open_in_buffer(run_dir, actor_id: str) -> set[str]:
    """Episodes of `actor_id` with acked turns but no final one that the buffer has not served or dropped."""
    led = Ledger.read(run_dir)
    closed = set(led.dropped) | {ep for _, _, ids in led.served for ep in ids}
    return {ep for ep, turns in led.chunks.items() if ep.startswith(actor_id + "-") and ep not in closed
            and not any(done for _, done, _ in turns.values())}


def _stop_holding_open_episodes(run_dir, child, actor_id: str) -> set[str]:
    """Freeze the actor at a moment the buffer holds some of its episodes open, then kill it."""
    for _ in range(60):
        os.killpg(child.proc.pid, signal.SIGSTOP)
        time.sleep(0.3)  # chunks already on the wire are acked (and audited) meanwhile
        held = _open_in_buffer(run_dir, actor_id)
        if held:
            os.killpg(child.proc.pid, signal.SIGKILL)
            return held
        os.killpg(child.proc.pid, signal.SIGCONT)
        time.sleep(0.5)
    raise AssertionError(f"{actor_id} never held an open episode in the buffer")


def test_actors_join_and_leave_a_running_buffer_and_learner(vllm_url, tiny_model, tmp_path):
    from turnstream.core.config import Config
    from turnstream.launch.processes import ProcessGroup, free_port

    cfg = Config()
    cfg.run.run_dir = str(tmp_path)
    cfg.model.path = str(tiny_model)
    cfg.vllm.urls = [vllm_url]
    cfg.env.name, cfg.env.args = "follow_signs", {"junctions": [6]}  # long enough to be cut mid-episode
    cfg.actor.concurrent_episodes = 8
    cfg.buffer.batch_episodes = 32
    # a stopped actor's open episodes expire soon; a live episode's turn (request + step) stays within the timeout
    cfg.buffer.episode_timeout_s, cfg.actor.request_timeout_s, cfg.env.step_timeout_s = 8.0, 6.0, 1.0
    # a fast learner would otherwise drop the stopped actor's open episodes as stale before they time out
    cfg.buffer.max_staleness = 1000
    cfg.buffer.actor_timeout_s = 3.0
    for name in ("buffer_ingest_port", "buffer_serve_port", "learner_pub_port"):
        setattr(cfg.network, name, free_port())
    cfg.buffer.metrics_port = free_port()
    cfg.actor.metrics_port = free_port()  # actor i serves on metrics_port + i
    path = tmp_path / "run.toml"
    path.write_text(cfg.dumps())
    role = [sys.executable, "-m", "turnstream.cli"]
    buffer_metrics = f"http://127.0.0.1:{cfg.buffer.metrics_port}/metrics"

    def actor_metrics(i):
        return f"http://127.0.0.1:{cfg.actor.metrics_port + i}/metrics"

    def acked(i):
        return _value(actor_metrics(i), 'turnstream_actor_acks_total{status="ok"}')

    def learner_steps():
        f = tmp_path / "learner.jsonl"
        return len(f.read_text().splitlines()) if f.exists() else 0

    procs = ProcessGroup(tmp_path)
    try:
        buffer = procs.start("buffer", [*role, "buffer", "--config", str(path)], env={"TURNSTREAM_AUDIT": "1"})
        learner = procs.start("learner", [*role, "learner", "--config", str(path)])
        actors = [procs.start("actor-0", [*role, "actor", "--config", str(path), "--index", "0"])]
        _wait(lambda: learner_steps() >= 1, 240, "the first learner step with one actor", procs)

        def rate(seconds=4.0) -> float:
            c0, t0 = _value(buffer_metrics, "turnstream_buffer_tokens_ingested_total"), time.monotonic()
            time.sleep(seconds)
            return (_value(buffer_metrics, "turnstream_buffer_tokens_ingested_total") - c0) / (time.monotonic() - t0)

        one = rate()
        for i in (1, 2):  # two more actors join the running system
            actors.append(procs.start(f"actor-{i}", [*role, "actor", "--config", str(path), "--index", str(i)]))
        _wait(lambda: acked(1) > 0 and acked(2) > 0, 180, "the new actors' first acked chunks", procs)
        three = rate()
        before = {i: acked(i) for i in range(3)}
        _wait(lambda: all(acked(i) > before[i] for i in range(3)), 60, "all three actors streaming", procs)
        steps_before = learner_steps()
        dropped_key = 'turnstream_buffer_dropped_episodes_total{reason="abandoned"}'
        abandoned_before = _value(buffer_metrics, dropped_key)
        held = _stop_holding_open_episodes(tmp_path, actors[2], "actor-2")  # leaves without a word, mid-episode
        _wait(lambda: held <= {ep for ep, why in Ledger.read(tmp_path).dropped.items() if why == "abandoned"}, 60,
              "the stopped actor's unfinished episodes to expire", procs)
        assert _value(buffer_metrics, dropped_key) - abandoned_before >= len(held)
        after = {i: acked(i) for i in range(2)}
        _wait(lambda: all(acked(i) > after[i] for i in range(2)) and learner_steps() > steps_before, 120,
              "the remaining actors and the learner to carry on", procs)
        two = rate()
        assert buffer.proc.poll() is None and learner.proc.poll() is None  # nothing restarted
        assert actors[0].proc.poll() is None and actors[1].proc.poll() is None
        print(f"scaling: ingested tokens/s with 1 actor {one:.0f}, 3 actors {three:.0f}, 2 actors {two:.0f}; "
              f"abandoned episodes {_value(buffer_metrics, dropped_key) - abandoned_before:.0f} "
              f"(the stopped actor held {len(held)} open)")
    finally:
        procs.stop_all()
        _restore(vllm_url, tiny_model, tmp_path)


def _restore(url, tiny_model, tmp_path):
    """The learner pushed into the session's server: put the original weights and version 0 back."""
    import torch
    from transformers import AutoModelForCausalLM

    from turnstream.learner.sync.disk import DiskWeightSync
    from turnstream.learner.weights.buckets import WeightBuckets

    sync = DiskWeightSync([url], tmp_path / "restore", tiny_model)
    state = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).state_dict()
    asyncio.run(sync.push(sync.save(WeightBuckets(state, None), 1), 1))
    asyncio.run(sync.set_version(0))
