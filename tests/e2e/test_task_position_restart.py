"""The task source's position survives a killed actor: buffer, learner and one actor on follow_signs with seven
junctions (128 tasks) play one sequential epoch; the actor is killed with SIGKILL part-way and started again, and the epoch goes on
from where it stood instead of being drawn again: every task is trained, and only the episodes in flight at
the kill are played twice."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.helpers import restore_served_weights, roles_log, run_until, session_server_config, start_run

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

TASKS, CONCURRENT, KILL_AT = 128, 2, 30


def test_a_restarted_actor_goes_on_with_its_epoch(vllm_url, tiny_model, tmp_path):
    from turnstream.actors.tasks.position import position_path
    from turnstream.launch.processes import ProcessGroup

    cfg = session_server_config(vllm_url, tiny_model, tmp_path)
    cfg.env.name, cfg.env.args = "follow_signs", {"junctions": [7]}
    cfg.tasks.order, cfg.tasks.epochs = "sequential", 1
    cfg.buffer.batch_episodes = 1  # every episode trains on its own, so the last ones are not left waiting
    cfg.actor.concurrent_episodes = CONCURRENT
    config = tmp_path / "run.toml"
    config.write_text(cfg.dumps())
    position = position_path(cfg.run.run_dir, 0)
    audit = tmp_path / "run" / "audit" / "learner.jsonl"

    def saved_draws() -> int:
        try:
            return json.loads(position.read_text())["draws"]
        except (OSError, ValueError):
            return 0

    def trained() -> list[str]:
        lines = audit.read_text().splitlines() if audit.exists() else []
        return [k for r in map(json.loads, lines) if "prompt_keys" in r for k in r["prompt_keys"]]

    procs = ProcessGroup(tmp_path)
    try:
        start_run(procs, config, learner_env={"TURNSTREAM_AUDIT": "1"})
        run_until(procs, lambda: saved_draws() >= KILL_AT - 2, lambda: f"saved position {saved_draws()}", 120)
        before = saved_draws()
        deadline = time.monotonic() + 30
        while saved_draws() == before and time.monotonic() < deadline:
            time.sleep(0.01)
        actor = next(c for c in procs.children if c.name == "actor-0")
        os.kill(actor.proc.pid, signal.SIGKILL)  # right after a save: what it played since is at most in flight
        actor.proc.wait(10)
        procs.children.remove(actor)  # gone for good; run_until watches the others
        killed_at = saved_draws()
        procs.start("actor-0-r2", list(actor.proc.args))
        run_until(procs, lambda: len(set(trained())) >= TASKS, lambda: f"{len(set(trained()))} tasks trained", 120)
        log = (tmp_path / "logs" / "actor-0-r2.log").read_text()
    finally:
        procs.stop_all()
        restore_served_weights(vllm_url, tiny_model, tmp_path)
    keys = trained()
    print(f"task position: killed after {killed_at} draws saved; {len(keys)} episodes trained over "
          f"{len(set(keys))} tasks (one epoch is {TASKS})")
    assert f"goes on at draw {killed_at}" in log, log[-2000:]
    assert len(set(keys)) == TASKS
    # drawn again from the start, the epoch would have trained the KILL_AT tasks before the kill twice
    assert len(keys) <= TASKS + 2 * CONCURRENT, sorted(keys)
