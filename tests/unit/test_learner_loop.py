"""The learner's loop (learner/serve.py) in-process: a tiny model on the CPU, an in-process buffer over real sockets,
and vLLM servers that never answer (every push fails, is counted, and the learner goes on, as it does in a run)."""
from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
import zmq.asyncio

from turnstream.core.config import Config
from turnstream.learner.device import served_dtype
from turnstream.learner.events import (LearnerEvent, LearnerStopped, Listeners, StepTrained, VersionPublished,
                                       VersionSaved)
from turnstream.launch.processes import free_port
from turnstream.learner.main import build_trainer
from turnstream.learner.metrics import LearnerMetrics
from turnstream.learner.record.format import incarnation_dir, step_file
from turnstream.learner.serve import open_endpoints, serve, train_and_publish
from turnstream.learner.sync.base import WeightSync
from turnstream.learner.sync.factory import weight_sync_from_config
from turnstream.protocol.chunk_batch import pack
from tests.helpers import chunk, in_process_buffer, stop_in_process_buffer


def _config(tmp_path: Path, tiny_model: Path, buffer_serve_port: int) -> Config:
    cfg = Config()
    cfg.run.run_dir = str(tmp_path / "run")
    cfg.model.path = str(tiny_model)
    cfg.vllm.urls = [f"http://127.0.0.1:{free_port()}"]  # nobody listens there
    cfg.learner.device = "cpu"
    cfg.learner.metrics_port = free_port()
    cfg.learner.max_steps = 2
    cfg.learner.overlap_push = False
    cfg.buffer.batch_episodes = 2
    cfg.network.buffer_serve_port = buffer_serve_port
    cfg.network.learner_pub_port = free_port()
    return cfg


async def _with_buffer(episodes: int, test) -> None:
    """`test(serve_port)` while an in-process buffer holds `episodes` complete one-turn episodes."""
    server, store, _ = in_process_buffer(batch_episodes=2)
    for e in range(episodes):
        assert store.ingest_message(b"a", pack([chunk(f"e{e}", 0, seq=e, done=True, reward=e % 2)])) == [
            (e, "ok", "")]
    ctx = zmq.asyncio.Context()
    running = [asyncio.create_task(server.run())]
    try:
        await test(server.serve_port)
    finally:
        await stop_in_process_buffer(running, server, ctx)


class Heard:
    """A listener that keeps what it hears and adds one figure of its own to each step."""

    def __init__(self):
        self.events: list[LearnerEvent] = []

    async def on_event(self, event: LearnerEvent) -> dict[str, float]:
        self.events.append(event)
        return {"heard_s": 0.25} if isinstance(event, VersionSaved) else {}


async def test_listeners_hear_each_step_in_order_and_their_figures_reach_its_line(tmp_path, tiny_model):
    async def test(serve_port):
        cfg = _config(tmp_path, tiny_model, serve_port)
        _, trainer, _ = build_trainer(cfg)
        metrics = LearnerMetrics()
        sync = weight_sync_from_config(cfg, tmp_path / "run" / "weights", None)
        heard, endpoints = Heard(), open_endpoints(cfg, metrics)
        dtype = served_dtype(cfg.vllm.dtype, cfg.model.path)
        try:
            await asyncio.wait_for(train_and_publish(cfg, trainer, 1, sync, dtype, metrics, endpoints,
                                                     Listeners([heard]), asyncio.Event()), 60)
        finally:
            await endpoints.close()
        assert [(type(e), e.version) for e in heard.events] == [
            (StepTrained, 1), (VersionSaved, 1), (VersionPublished, 1),
            (StepTrained, 2), (VersionSaved, 2), (VersionPublished, 2), (LearnerStopped, 2)]
        trained = [e for e in heard.events if isinstance(e, StepTrained)]
        assert [list(e.batch.episode_ids) for e in trained] == [["e0", "e1"], ["e2", "e3"]]
        published = [e.stats for e in heard.events if isinstance(e, VersionPublished)]
        assert [s["heard_s"] for s in published] == [0.25, 0.25]
        assert all(s["push_s"] != s["push_s"] for s in published)  # NaN: no server took the push
        assert metrics.registry.get_sample_value("turnstream_learner_weight_push_failures_total") == 2

    await _with_buffer(4, test)


async def test_the_configured_listeners_record_audit_checkpoint_and_log_each_step(tmp_path, tiny_model, monkeypatch):
    monkeypatch.setenv("TURNSTREAM_AUDIT", "1")

    async def test(serve_port):
        cfg = _config(tmp_path, tiny_model, serve_port)
        cfg.learner.record, cfg.learner.checkpoint_every = True, 1
        _, trainer, _ = build_trainer(cfg)
        await asyncio.wait_for(serve(cfg, trainer, 1), 60)

    await _with_buffer(4, test)
    run = tmp_path / "run"
    lines = [json.loads(line) for line in (run / "learner.jsonl").read_text().splitlines()]
    assert [s["version"] for s in lines] == [1, 2]
    for s in lines:  # the record's figures, then the checkpoint's, then the loop's and the push's
        keys = list(s)
        assert keys.index("record_bytes") < keys.index("record_wait_s") < keys.index("checkpoint_s") < keys.index(
            "wait_s") < keys.index("push_s")
        assert s["record_bytes"] > 0
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == ["step-000001", "step-000002"]
    assert sorted(p.name for p in incarnation_dir(run, 0).glob("step-*")) == [step_file(1), step_file(2)]
    audit = [json.loads(line) for line in (run / "audit" / "learner.jsonl").read_text().splitlines()]
    assert [(a["version"], a["episodes"]) for a in audit[1:]] == [(1, ["e0", "e1"]), (2, ["e2", "e3"])]


class WatcherFailed(RuntimeError):
    pass


async def _failing_watch(self, interval_s: float = 5.0) -> None:
    raise WatcherFailed("the watcher's own error")


async def test_a_failing_background_task_stops_the_learner_with_its_error(tmp_path, tiny_model, monkeypatch,
                                                                          caplog):
    async def test(serve_port):
        cfg = _config(tmp_path, tiny_model, serve_port)
        cfg.learner.max_steps = 0  # only a stop ends it
        _, trainer, _ = build_trainer(cfg)
        monkeypatch.setattr(WeightSync, "watch", _failing_watch)
        with caplog.at_level(logging.ERROR), pytest.raises(WatcherFailed, match="the watcher's own error"):
            await asyncio.wait_for(serve(cfg, trainer, 1), 30)

    await _with_buffer(0, test)
    assert "weight-sync watcher ended (WatcherFailed(\"the watcher's own error\")): stopping" in caplog.text
