"""Held-out evaluation (actors/evaluation.py): the split, training orders that never draw a held-out task,
evaluation rounds that stream nothing, and the report's evaluation curve."""
from __future__ import annotations

import asyncio
import json

import pytest

from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.envs.tasks.follow_signs import FollowSigns
from turnstream.actors.evaluation import Evaluator, round_plan
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.context import Sampling
from turnstream.actors.play.env_loop import EnvironmentLoop
from turnstream.actors.envs.registry import make_env
from turnstream.actors.tasks.eval_split import split_tasks
from turnstream.actors.tasks.orders import RandomOrder, make_order
from turnstream.actors.tasks.source import TaskSource
from turnstream.actors.play.runner import EpisodeRunner
from turnstream.core.config import ConfigError, load_config
from turnstream.checks.preflight import preflight
from turnstream.reports.figures import main as report_main
from turnstream.reports.run_log import pooled_evals, read_evals
from tests.helpers import until
from tests.unit.fakes import CollectingLink, ScriptedClient

N = 28  # follow_signs' tasks


# ---- the split -----------------------------------------------------------------------------------------

def test_the_split_is_deterministic_disjoint_and_covers_every_task():
    train, held = split_tasks(N, 0.25, run_seed=3)
    assert (train, held) == split_tasks(N, 0.25, run_seed=3)  # what every actor computes
    assert len(held) == 7 and not set(train) & set(held) and sorted(train + held) == list(range(N))
    assert split_tasks(N, 0.25, run_seed=4)[1] != held  # drawn with the run's seed
    assert split_tasks(N, 0.0, run_seed=3) == (list(range(N)), [])


def test_a_split_that_holds_out_nothing_or_everything_is_a_config_error():
    with pytest.raises(ConfigError, match="^tasks.eval_split: 0.01 of 28 tasks holds out 0"):
        split_tasks(N, 0.01, run_seed=0)
    with pytest.raises(ConfigError, match="^tasks.eval_split"):
        split_tasks(2, 0.9, run_seed=0)


def _order(name, **kw):
    return make_order(name, env_factory=lambda: make_env("follow_signs"), actor_seed=5, run_seed=3,
                      eval_split=0.25, **kw)


@pytest.mark.parametrize("name", ["random", "sequential", "spo"])
def test_training_orders_never_draw_a_held_out_task(name):
    train, _ = split_tasks(N, 0.25, run_seed=3)
    order = _order(name)
    drawn = [order.draw().task for _ in range(2000)]
    assert set(drawn) == set(train)  # every training task, no held-out one


def test_sequential_epochs_and_shards_cover_the_training_tasks_only():
    train, _ = split_tasks(N, 0.25, run_seed=3)
    shards = [_order("sequential", epochs=2, shard=k, num_shards=3) for k in range(3)]
    drawn = [a for s in shards for a in iter(s.draw, None)]
    assert sorted(a.task for a in drawn) == sorted(train * 2)
    assert len({a.seed for a in drawn}) == len(drawn)  # seeds stay distinct over the run


def test_random_order_without_a_split_keeps_its_fresh_seeds():
    assert make_order("random", env_factory=lambda: 1 / 0, actor_seed=5, run_seed=3).draw().task is None
    assert RandomOrder(5, [4]).draw().task == 4


def test_a_split_needs_an_environment_that_enumerates_its_tasks():
    with pytest.raises(ConfigError, match="^tasks.eval_split: holding out evaluation tasks needs"):
        make_order("random", env_factory=lambda: make_env("trivial"), actor_seed=0, run_seed=0, eval_split=0.25)
    with pytest.raises(ConfigError, match="^tasks.eval_split"):
        preflight(load_config(None, ["tasks.eval_split=0.25", "env.name=trivial"]))
    preflight(load_config(None, ["tasks.eval_split=0.25", "env.name=follow_signs"]))
    with pytest.raises(ConfigError, match="^tasks.eval_episodes: only with eval_split > 0"):
        load_config(None, ["tasks.eval_episodes=8"])
    with pytest.raises(ConfigError, match="^tasks.eval_split"):
        load_config(None, ["tasks.eval_split=1.0"])


def test_round_plans_split_the_positions_between_actors_and_cycle_the_tasks():
    held = [2, 9, 17]
    assert round_plan(held) == [(0, 2), (1, 9), (2, 17)]
    parts = [round_plan(held, episodes=8, shard=k, num_shards=3) for k in range(3)]
    assert sorted(p for part in parts for p in part) == [(p, held[p % 3]) for p in range(8)]
    assert round_plan(held, shard=5, num_shards=6) == []


# ---- rounds ---------------------------------------------------------------------------------------------

class RecordingSigns(FollowSigns):
    resets: list[int | None] = []

    async def reset(self, seed, task=None):
        RecordingSigns.resets.append(task)
        return await super().reset(seed, task)


async def test_rounds_follow_the_learner_version_and_stream_nothing(tiny_model, tmp_path):
    _, held = split_tasks(N, 0.25, run_seed=3)
    link, metrics = CollectingLink(credits=0), ActorMetrics()
    RecordingSigns.resets = []
    runner = EpisodeRunner(actor_id="a", epoch=1, player=EnvironmentLoop(RecordingSigns), chat=ChatTokens(tiny_model),
                           client=ScriptedClient(), link=link, sampling=Sampling(1.0, 16, 512), metrics=metrics,
                           tasks=TaskSource(RandomOrder(0)))
    version: list[int | None] = [None]
    evaluator = Evaluator(runner, held, every=2, version=lambda: version[0], concurrency=3,
                          log_path=tmp_path / "run" / "eval.jsonl", poll_s=0.001)
    task = asyncio.create_task(evaluator.run())

    def lines():
        return read_evals(tmp_path / "run")

    try:
        await asyncio.sleep(0.05)
        assert lines() == []  # nothing before the actor has heard the version from the buffer
        for v, rounds in ((0, 1), (1, 1), (3, 2), (7, 3)):
            version[0] = v
            await until(lambda: len(lines()) == rounds, f"{rounds} rounds at version {v}", 10)
        await asyncio.sleep(0.05)
    finally:
        task.cancel()
    got = lines()
    assert [e["version"] for e in got] == [0, 2, 6]  # round at version 0, then the newest multiple reached
    assert all(e["episodes"] == len(held) and e["actor"] == "a" and 0 <= e["success"] <= 1 for e in got)
    assert sorted(RecordingSigns.resets) == sorted(held * 3)  # only held-out tasks, each once per round
    assert link.chunks == [] and link.credits == 0  # no chunk left, no credit taken
    assert evaluator.context.link.dropped > 0
    played = sum(metrics.registry.get_sample_value("turnstream_actor_eval_episodes_total", {"outcome": o}) or 0
                 for o in ("success", "done", "truncated"))
    assert played == 3 * len(held)
    assert metrics.registry.get_sample_value("turnstream_actor_eval_learner_version") == 6
    assert metrics.registry.get_sample_value("turnstream_actor_eval_success_ratio") == got[-1]["success"]
    # the training runner still streams to the real link
    assert runner.context.link is link
    await runner.play("train", seed=0, task=held[0])
    assert link.chunks


# ---- report ---------------------------------------------------------------------------------------------

def test_report_pools_the_actors_parts_and_plots_evaluation(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    steps = [{"version": v, "episodes": 8, "return_mean": 0.1 * v, "tokens": 100, "wall_s": v, "time": 100.0 + v}
             for v in range(1, 7)]
    (run / "learner.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    evals = [{"version": 0, "success": 0.25, "episodes": 4, "time": 1.0, "actor": "actor-0"},
             {"version": 0, "success": 0.0, "episodes": 3, "time": 1.0, "actor": "actor-1"},
             {"version": 4, "success": 1.0, "episodes": 4, "time": 2.0, "actor": "actor-0"}]
    (run / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals) + '{"version": ')
    assert pooled_evals(read_evals(run)) == [(0, 1 / 7, 7), (4, 1.0, 4)]
    assert report_main(run) == 0
    assert (run / "report" / "success.png").read_bytes()[:4] == b"\x89PNG"
    assert (run / "learning_curve.png").stat().st_size > 0
