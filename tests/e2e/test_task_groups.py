"""Groups through real processes: with `tasks.group_size = 4` one actor plays each task four times in a row,
the buffer (`sampling = "group"`) serves only whole groups, and a grpo learner trains on them; no group is
left waiting for a member (`group_timeout`)."""
from __future__ import annotations

import json
import sys
import time

import pytest

from tests.helpers import restore_served_weights, scrape, session_server_config

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

GROUP = 4


def test_an_actor_completes_whole_groups_and_grpo_trains_on_them(vllm_url, tiny_model, tmp_path):
    from turnstream.launch.processes import ProcessGroup, free_port, tail

    cfg = session_server_config(vllm_url, tiny_model, tmp_path)
    cfg.env.name = "follow_signs"
    cfg.tasks.group_size = GROUP
    cfg.buffer.sampling = "group"
    cfg.buffer.batch_episodes = 2 * GROUP
    cfg.learner.estimator = "grpo"
    cfg.actor.concurrent_episodes = 2 * GROUP
    cfg.buffer.metrics_port = free_port()
    config = tmp_path / "run.toml"
    config.write_text(cfg.dumps())

    role = [sys.executable, "-m", "turnstream.cli"]
    procs = ProcessGroup(tmp_path)
    learner_log = tmp_path / "run" / "learner.jsonl"

    def steps() -> list[dict]:
        return [json.loads(line) for line in learner_log.read_text().splitlines()] if learner_log.exists() else []

    def logs() -> str:
        return "\n".join(f"--- {c.name}\n{tail(c.log_path, 15)}" for c in procs.children)

    try:
        procs.start("buffer", [*role, "buffer", "--config", str(config)])
        procs.start("learner", [*role, "learner", "--config", str(config)])
        procs.start("actor-0", [*role, "actor", "--config", str(config), "--index", "0"])
        deadline = time.monotonic() + 100
        while len(steps()) < 4:
            assert all(c.proc.poll() is None for c in procs.children), f"a role died\n{logs()}"
            assert time.monotonic() < deadline, f"{len(steps())} learner steps within the deadline\n{logs()}"
            time.sleep(1)
        buffer = scrape(f"http://127.0.0.1:{cfg.buffer.metrics_port}/metrics")
        groups = buffer.get("turnstream_buffer_groups_served_total", 0.0)
        served = buffer.get("turnstream_buffer_samples_total", 0.0)
        timed_out = buffer.get('turnstream_buffer_dropped_episodes_total{reason="group_timeout"}', 0.0)
        trained = [s["episodes"] for s in steps()]
        print(f"groups: {len(trained)} learner steps on {trained} episodes, {groups:.0f} groups of {GROUP} served "
              f"({served:.0f} episodes), {timed_out:.0f} episodes dropped for group_timeout")
        assert groups >= 2 * 4 and served == GROUP * groups  # every served episode was in a whole group
        assert all(n % GROUP == 0 and n > 0 for n in trained), trained  # each step trained on whole groups
        assert timed_out == 0
        assert all(c.proc.poll() is None for c in procs.children), logs()
    finally:
        procs.stop_all()
        restore_served_weights(vllm_url, tiny_model, tmp_path)
