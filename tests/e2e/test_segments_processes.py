"""Learning from open episodes through the real processes: buffer, learner (turn_gae) and an actor on a trail of
24 markers (24-29 turns an episode), `buffer.segment_turns = 4`. The buffer is killed with SIGKILL part-way and
started again on its write-ahead log. From the buffer's audit trail: segments of open episodes were served
before their episodes ended, each episode's turns were handed out in one unbroken sequence of pieces (no turn
twice, none skipped), also across the restart; the learner trained on them."""
from __future__ import annotations

import json
import sys

import pytest

from tests.helpers import restore_served_weights, roles_log, run_until, scrape, session_server_config

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

SEGMENT_TURNS, MARKERS = 4, 24


def _audit(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_open_episodes_train_in_segments_each_turn_once_across_a_buffer_restart(vllm_url, tiny_model, tmp_path):
    from turnstream.launch.processes import ProcessGroup, free_port

    cfg = session_server_config(vllm_url, tiny_model, tmp_path)
    cfg.env.name, cfg.env.args = "trail", {"length": MARKERS}
    cfg.learner.estimator = "turn_gae"
    cfg.buffer.segment_turns = SEGMENT_TURNS
    cfg.buffer.batch_episodes = 8
    cfg.actor.concurrent_episodes = 8
    cfg.buffer.metrics_port = free_port()
    config = tmp_path / "run.toml"
    config.write_text(cfg.dumps())
    buffer_audit = tmp_path / "run" / "audit" / "buffer.jsonl"
    audit_env = {"TURNSTREAM_AUDIT": "1"}
    role = [sys.executable, "-m", "turnstream.cli"]

    def segments() -> int:
        return sum("served_segment" in r for r in _audit(buffer_audit))

    def steps() -> list[dict]:
        path = tmp_path / "run" / "learner.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    procs = ProcessGroup(tmp_path)
    try:
        buffer = procs.start("buffer", [*role, "buffer", "--config", str(config)], env=audit_env)
        procs.start("learner", [*role, "learner", "--config", str(config)])
        procs.start("actor-0", [*role, "actor", "--config", str(config), "--index", "0"])
        run_until(procs, lambda: segments() >= 12, lambda: f"{segments()} segments served", 240)
        procs.restart(buffer)  # SIGKILL, then the same command again: it replays its write-ahead log
        served_before = segments()
        run_until(procs, lambda: segments() >= served_before + 12 and sum(s["episodes"] for s in steps()) >= 8,
                  lambda: f"{segments()} segments, {sum(s['episodes'] for s in steps())} episodes trained", 240)
        buffer_metrics = scrape(f"http://127.0.0.1:{cfg.buffer.metrics_port}/metrics")
    finally:
        procs.stop_all()
        restore_served_weights(vllm_url, tiny_model, tmp_path)

    pieces: dict[str, list[tuple[int, int]]] = {}
    trained_pieces: list[tuple[int, int]] = []  # those served to the learner, not passed over as stale
    whole: list[str] = []
    for r in _audit(buffer_audit):
        if "served_segment" in r:
            pieces.setdefault(r["served_segment"], []).append(tuple(r["turns"]))
            if not r.get("stale"):
                trained_pieces.append(tuple(r["turns"]))
        elif "served" in r:
            whole.extend(r["served"])
    assert len(whole) == len(set(whole)), "an episode's last piece served twice"
    for episode, spans in pieces.items():
        ends = [0] + [end for _, end in spans]
        assert [first for first, _ in spans] == ends[:-1], f"{episode}: pieces {spans} overlap or skip turns"

    # stale turns (the learner moved on while the buffer was down) are passed over in spans of any length
    assert all(end - first >= SEGMENT_TURNS for first, end in trained_pieces), trained_pieces
    finished_in_pieces = [e for e in whole if e in pieces]
    trained = steps()
    print(f"segments: {sum(map(len, pieces.values()))} segments of {len(pieces)} open episodes, "
          f"{len(finished_in_pieces)} of them finished; {len(trained)} learner steps, "
          f"{sum(s['segments'] for s in trained)} segments and {sum(s['episodes'] for s in trained)} episodes "
          f"trained; turn-to-train count {buffer_metrics.get('turnstream_buffer_turn_to_train_seconds_count')}")
    assert finished_in_pieces, "no episode trained in segments reached its end"
    assert sum(s["segments"] for s in trained) > 0 and sum(s["episodes"] for s in trained) > 0
    assert buffer_metrics.get("turnstream_buffer_turn_to_train_seconds_count", 0) > 0, roles_log(procs)

