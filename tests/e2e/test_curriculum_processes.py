"""SPO's curriculum through real processes: the learner announces its tracker's values, the actor's spo order
draws by them, and the episodes trained shift towards the tasks whose outcome is uncertain.

The task set (`fixed_odds`): four tasks every episode solves, four that succeed half the time, whatever the
policy does, so only the task source decides the shares. `random` trains about half its episodes on the
uncertain tasks; SPO's weights sqrt(v(1 - v)) + 0.05 put about 0.55 on an uncertain task against about 0.2 on
a solved one once the tracker has seen them, so the curriculum's share should approach 0.7."""
from __future__ import annotations

import json

import pytest

from tests.helpers import restore_served_weights, run_until, session_server_config, start_run

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

RATES = [1.0] * 4 + [0.5] * 4
UNCERTAIN = {f"fixed_odds/{task}" for task, p in enumerate(RATES) if p < 1.0}
STEPS, WARMUP_STEPS, BATCH = 20, 4, 32


def trained_prompt_keys(order: str, vllm_url, tiny_model, tmp_path) -> list[list[str]]:
    """The prompt keys of every trained batch (the learner's audit lines) of a run with `order`."""
    from turnstream.launch.processes import ProcessGroup

    tmp_path.mkdir(parents=True)
    cfg = session_server_config(vllm_url, tiny_model, tmp_path)
    cfg.env.name, cfg.env.args = "fixed_odds", {"success_rates": RATES}
    cfg.tasks.order = order
    cfg.learner.estimator = "spo"
    cfg.buffer.batch_episodes = BATCH
    cfg.actor.concurrent_episodes = 8
    config = tmp_path / "run.toml"
    config.write_text(cfg.dumps())
    audit = tmp_path / "run" / "audit" / "learner.jsonl"

    def batches() -> list[list[str]]:
        lines = audit.read_text().splitlines() if audit.exists() else []
        return [r["prompt_keys"] for r in map(json.loads, lines) if "prompt_keys" in r]

    procs = ProcessGroup(tmp_path)
    try:
        start_run(procs, config, learner_env={"TURNSTREAM_AUDIT": "1"})
        run_until(procs, lambda: len(batches()) >= STEPS, lambda: f"{len(batches())} learner steps", 150)
        return batches()[:STEPS]
    finally:
        procs.stop_all()
        restore_served_weights(vllm_url, tiny_model, tmp_path)


def uncertain_share(batches: list[list[str]]) -> float:
    keys = [k for batch in batches[WARMUP_STEPS:] for k in batch]  # once the tracker has seen every task
    return sum(k in UNCERTAIN for k in keys) / len(keys)


def test_the_spo_curriculum_spends_more_episodes_on_uncertain_tasks_than_random(vllm_url, tiny_model, tmp_path):
    shares = {order: uncertain_share(trained_prompt_keys(order, vllm_url, tiny_model, tmp_path / order))
              for order in ("random", "spo")}
    print(f"share of trained episodes on the uncertain half (steps {WARMUP_STEPS + 1}-{STEPS}, {BATCH} episodes "
          f"each): random {shares['random']:.3f}, spo {shares['spo']:.3f}")
    assert 0.4 < shares["random"] < 0.6  # the uncertain half is half the tasks
    # about 3 standard deviations of the two shares' difference (about 550 episodes each) below the expected gap
    assert shares["spo"] > shares["random"] + 0.08
