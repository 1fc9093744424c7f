"""Held-out evaluation through real processes: buffer, learner and one actor on follow_signs (28 tasks) with a
quarter of the tasks held out. The actor plays a round of the 7 held-out tasks every 2 learner versions
(eval.jsonl, its metrics), and no trained batch (the learner's audit lines) holds an episode of one of them."""
from __future__ import annotations

import json

import pytest

from tests.helpers import restore_served_weights, roles_log, run_until, scrape, session_server_config, start_run

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

SPLIT, EVERY, STEPS, ROUNDS = 0.25, 2, 4, 3


def test_held_out_tasks_are_evaluated_every_few_versions_and_never_trained_on(vllm_url, tiny_model, tmp_path):
    from turnstream.actors.tasks.eval_split import split_tasks
    from turnstream.actors.envs.registry import make_env
    from turnstream.launch.processes import ProcessGroup, free_port

    cfg = session_server_config(vllm_url, tiny_model, tmp_path)
    cfg.env.name = "follow_signs"
    cfg.tasks.eval_split, cfg.tasks.eval_every = SPLIT, EVERY
    cfg.buffer.batch_episodes = 8
    cfg.actor.concurrent_episodes = 8
    cfg.actor.metrics_port = free_port()
    config = tmp_path / "run.toml"
    config.write_text(cfg.dumps())
    env = make_env("follow_signs")
    train, held = split_tasks(env.num_tasks, SPLIT, cfg.run.seed)
    held_keys = {f"follow_signs/{env.task_signs(t)}" for t in held}
    train_keys = {f"follow_signs/{env.task_signs(t)}" for t in train}
    run = tmp_path / "run"

    def lines(name: str) -> list[dict]:
        path = run / name
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    procs = ProcessGroup(tmp_path)
    try:
        start_run(procs, config, learner_env={"TURNSTREAM_AUDIT": "1"})
        run_until(procs, lambda: len(lines("learner.jsonl")) >= STEPS and len(lines("eval.jsonl")) >= ROUNDS,
                  lambda: f"{len(lines('learner.jsonl'))} steps, {len(lines('eval.jsonl'))} rounds", 110)
        rounds = lines("eval.jsonl")
        actor = scrape(f"http://127.0.0.1:{cfg.actor.metrics_port}/metrics")  # after: it has seen those rounds
        batches = [r["prompt_keys"] for r in lines("audit/learner.jsonl") if "prompt_keys" in r]
        assert all(c.proc.poll() is None for c in procs.children), roles_log(procs)
    finally:
        procs.stop_all()
        restore_served_weights(vllm_url, tiny_model, tmp_path)
    trained = [k for batch in batches for k in batch]
    evaluated = sum(v for k, v in actor.items() if k.startswith("turnstream_actor_eval_episodes_total"))
    print(f"evaluation: rounds at versions {[r['version'] for r in rounds]}, success "
          f"{[round(r['success'], 2) for r in rounds]}; {len(trained)} episodes trained in {len(batches)} "
          f"batches on {len(set(trained))} of {len(train_keys)} training tasks")
    versions = [r["version"] for r in rounds]
    assert versions[0] == 0 and versions == sorted(set(versions)) and all(v % EVERY == 0 for v in versions)
    assert all(r["episodes"] == len(held) and r["actor"] == "actor-0" for r in rounds)  # one actor: every task
    assert evaluated >= len(held) * len(rounds)
    assert actor["turnstream_actor_eval_learner_version"] >= versions[-1]
    assert trained and not set(trained) & held_keys  # no held-out task ever entered a batch
    assert set(trained) <= train_keys
