"""What an environment reports about an episode in numbers (the numeric entries of its last Step.info): carried out
of the player beside the outcome, observed per key by the actor's metrics, averaged into eval.jsonl and pooled by
the report."""
from __future__ import annotations

import json
import logging

import pytest

from turnstream.actors.environment import Environment, Reset, Step
from turnstream.actors.envs.registry import make_env
from turnstream.actors.evaluation import Evaluator
from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.context import Sampling
from turnstream.actors.play.env_loop import EnvironmentLoop
from turnstream.actors.play.episode_figures import EpisodeFigures
from turnstream.actors.play.player import Episode
from turnstream.actors.play.runner import EpisodeRunner
from turnstream.actors.tasks.orders import RandomOrder, SequentialOrder
from turnstream.actors.tasks.source import TaskSource
from turnstream.reports.figures import main as report_main
from turnstream.reports import run_log
from turnstream.reports.run_log import pooled_evals, read_evals
from tests.unit.fakes import CollectingLink, ScriptedClient

INFO = "turnstream_actor_episode_info_values"
DROPPED = "turnstream_actor_episode_info_dropped_keys_total"


class Reporting(Environment):
    """Two turns; the last step's info carries the success flag, figures, a string and a bool. Task t reports
    tool_calls = t and succeeds on even tasks."""

    num_tasks = 8

    async def reset(self, seed, task=None):
        self.task, self.turn = seed if task is None else task, 0
        return Reset("go", f"reporting/{self.task}")

    async def step(self, action):
        self.turn += 1
        if self.turn < 2:
            return Step("again", 0.0, False, info={"success": False, "tool_calls": 99, "midway": 1.0})
        return Step("end", 1.0, True, info={"success": self.task % 2 == 0, "tool_calls": self.task, "note": "x",
                                            "flag": True, "latency": 0.5 * self.task})


def _runner(tiny_model, factory, metrics=None, tasks=None):
    return EpisodeRunner(actor_id="a", epoch=1, player=EnvironmentLoop(factory), chat=ChatTokens(tiny_model),
                         client=ScriptedClient(), link=CollectingLink(), sampling=Sampling(1.0, 16, 512),
                         metrics=metrics or ActorMetrics(), tasks=tasks or TaskSource(RandomOrder(0)))


def _sample(metrics, name, **labels) -> float:
    return metrics.registry.get_sample_value(name, labels or None) or 0.0


# ---- the figures of one episode ------------------------------------------------------------------------

def test_only_the_numbers_of_the_info_are_figures_and_success_stays_the_outcomes():
    figures = EpisodeFigures.from_info({"success": True, "tool_calls": 2, "note": "x", "flag": True})
    assert figures.values == {"tool_calls": 2.0}
    assert EpisodeFigures.from_info({"success": 1, "score": 0.25, "n": -3}).values == {"score": 0.25, "n": -3.0}
    # a NaN or an infinity would spoil every mean it joins; a non-string key is no name
    assert EpisodeFigures.from_info({"bad": float("nan"), "inf": float("inf"), 7: 1.0}).values == {}
    assert EpisodeFigures.from_info(None).values == {}


async def test_the_last_step_info_of_an_episode_gives_its_figures(tiny_model):
    metrics = ActorMetrics()
    runner = _runner(tiny_model, Reporting, metrics)
    episode = Episode("ep", seed=0, task=3)
    assert await runner.player.play(runner.context, episode) == "done"
    assert episode.figures.values == {"tool_calls": 3.0, "latency": 1.5}  # the last step's, not the first's


# ---- training episodes: the actor's metric ---------------------------------------------------------------

async def test_training_episodes_observe_their_figures_per_key(tiny_model):
    metrics = ActorMetrics()
    runner = _runner(tiny_model, Reporting, metrics, tasks=TaskSource(SequentialOrder(4, run_seed=0, epochs=1)))
    await runner.run(2)
    assert _sample(metrics, f"{INFO}_count", key="tool_calls") == 4
    assert _sample(metrics, f"{INFO}_sum", key="tool_calls") == 0 + 1 + 2 + 3
    assert _sample(metrics, f"{INFO}_sum", key="latency") == pytest.approx(0.5 * 6)
    for absent in ("success", "note", "flag", "midway"):
        assert _sample(metrics, f"{INFO}_count", key=absent) == 0
    assert _sample(metrics, DROPPED) == 0


def test_keys_past_the_cap_are_counted_and_logged_once(caplog):
    metrics = ActorMetrics()
    cap = metrics.episode_info.max_keys
    with caplog.at_level(logging.WARNING, logger="turnstream.actor"):
        for _ in range(3):
            metrics.episode_info.observe({f"k{i}": float(i) for i in range(cap + 2)})
    assert all(_sample(metrics, f"{INFO}_count", key=f"k{i}") == 3 for i in range(cap))
    assert _sample(metrics, f"{INFO}_count", key=f"k{cap}") == 0
    assert _sample(metrics, DROPPED) == 2 * 3  # every figure left out
    assert sum("episode info" in r.getMessage() for r in caplog.records) == 1
    # a key too long to be a label value is left out the same way
    metrics.episode_info.observe({"k0": 1.0, "x" * 200: 1.0})
    assert _sample(metrics, f"{INFO}_count", key="k0") == 4 and _sample(metrics, DROPPED) == 7


# ---- held-out rounds and the report ----------------------------------------------------------------------

async def test_an_eval_line_carries_the_rounds_mean_of_each_figure(tiny_model, tmp_path):
    runner = _runner(tiny_model, Reporting)
    path = tmp_path / "eval.jsonl"
    evaluator = Evaluator(runner, [1, 2, 4, 5], every=1, version=lambda: 0, concurrency=2, log_path=path)
    line = await evaluator.play_round(0)
    assert line["info"] == {"tool_calls": 3.0, "latency": 1.5}
    assert line["info_episodes"] == {"tool_calls": 4, "latency": 4}
    assert line["success"] == 0.5 and json.loads(path.read_text()) == line


async def test_an_eval_line_has_no_info_when_no_episode_reported_a_figure(tiny_model, tmp_path):
    runner = _runner(tiny_model, lambda: make_env("follow_signs"))
    line = await Evaluator(runner, [0, 1], every=1, version=lambda: 0).play_round(0)
    assert "info" not in line and "info_episodes" not in line


def test_the_report_pools_each_figure_episode_weighted(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    steps = [{"version": v, "episodes": 8, "return_mean": 0.1, "tokens": 100, "wall_s": v, "time": 100.0 + v}
             for v in range(1, 4)]
    (run / "learner.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    evals = [{"version": 0, "success": 0.5, "episodes": 4, "time": 1.0, "actor": "actor-0",
              "info": {"tool_calls": 1.0, "latency": 2.0}, "info_episodes": {"tool_calls": 4, "latency": 2}},
             {"version": 0, "success": 0.0, "episodes": 2, "time": 1.0, "actor": "actor-1",
              "info": {"tool_calls": 4.0}, "info_episodes": {"tool_calls": 2}},
             {"version": 2, "success": 1.0, "episodes": 3, "time": 2.0, "actor": "actor-0",
              "info": {"tool_calls": 0.5}},  # without counts: every scored episode reported it
             {"version": 4, "success": 1.0, "episodes": 3, "time": 3.0, "actor": "actor-0"}]
    (run / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    assert pooled_evals(read_evals(run)) == [(0, 2 / 6, 6), (2, 1.0, 3), (4, 1.0, 3)]  # unchanged
    assert run_log.pooled_eval_info(read_evals(run)) == {0: {"tool_calls": (4 * 1.0 + 2 * 4.0) / 6, "latency": 2.0},
                                                 2: {"tool_calls": 0.5}}
    assert report_main(run) == 0
    assert (run / "report" / "success.png").read_bytes()[:4] == b"\x89PNG"
    # the demo's last line: the first and last rounds that have figures
    summary = run_log.held_out_summary(read_evals(run))
    assert summary == {"eval_start": 2 / 6, "eval_end": 1.0, "eval_end_version": 4,
                       "eval_info_start": {"tool_calls": 2.0, "latency": 2.0}, "eval_info_end": {"tool_calls": 0.5}}


# ---- math_tool reports its calls ------------------------------------------------------------------------

async def test_math_tool_reports_its_tool_calls_on_the_answer_and_at_the_refusal():
    env = make_env("math_tool", terms=[2], max_tool_calls=2)
    await env.reset(3)
    await env.step("calc 1+1")
    answer = await env.step("answer 5")
    assert answer.done and EpisodeFigures.from_info(answer.info).values == {"tool_calls": 1.0}
    await env.reset(3)
    assert (await env.step("answer 5")).info["tool_calls"] == 0  # answered directly
    await env.reset(3)
    steps = [await env.step("calc 1+1"), await env.step("calc 2+2"), await env.step("calc 3+3")]
    refused = steps[-1]
    assert refused.done and refused.truncated and refused.info["tool_calls"] == 2  # the refused call never ran
