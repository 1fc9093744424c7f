"""`turnstream make-tiny-model --warm-start`'s parts: the scripted solvers solve their tasks, the share of
mistakes is calibrated to a success rate, the transcripts are the tokens the actor's environment loop builds
(contexts restarted as the actor restarts them), and the build is the same for the same seed."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.context import Sampling
from turnstream.actors.play.env_loop import EnvironmentLoop
from turnstream.actors.play.runner import EpisodeRunner
from turnstream.actors.envs.registry import make_env
from turnstream.actors.tasks.orders import RandomOrder
from turnstream.actors.tasks.source import TaskSource
from turnstream.cli import main as cli_main
from turnstream.sft.transcripts import Limit, TranscriptRenderer
from turnstream.warm_start.build import MODEL_INFO, SftPhase, WarmStartPlan, make_reading_model, same_weight
from turnstream.warm_start.calibrate import FIXED_MISTAKES, mistakes_for, solver_success
from turnstream.warm_start.episodes import DEFAULT_TASKS, play, play_many, task_named
from turnstream.warm_start.solvers import SOLVERS
from tests.unit.fakes import CollectingLink
from tests.unit.test_sft_transcripts import Replies


@pytest.mark.parametrize("env", sorted(set(SOLVERS) - set(FIXED_MISTAKES)))
def test_each_solver_without_mistakes_solves_its_task(env):
    episodes = 4 if env == "math_tool" else 40  # math_tool's tool runs in a subprocess
    assert solver_success(task_named(env), 0.0, episodes) == 1.0


def test_the_tictactoe_solver_plays_both_sides_legally_each_in_its_own_conversation():
    played = play_many(task_named("tictactoe"), range(60), FIXED_MISTAKES["tictactoe"])
    for p in played:
        for (observation, answer), agent in zip(p.turns, p.agents):
            first, *rows = observation.splitlines()
            assert first == f"you are {'XO'[agent]}" and "".join(rows)[int(answer) - 1] == "."  # a free cell
        for transcript in p.transcripts(0):
            sides = {m["content"].splitlines()[0] for m in transcript["messages"] if m["role"] == "user"}
            assert len(sides) == 1  # an agent sees only its own turns
    # the solver blocks and completes lines: without mistakes, fewer games are decided than with random moves
    assert solver_success(task_named("tictactoe"), 0.0, 200) < solver_success(task_named("tictactoe"), 1.0, 200)


def test_mistakes_are_valid_moves_that_cost_success():
    # follow_signs fails at the first wrong answer: with junctions [3], success is (1 - share)^3
    task = task_named("follow_signs", {"junctions": [3]})
    assert abs(solver_success(task, 0.2, 2000) - 0.8 ** 3) < 0.03
    played = play_many(task, range(50), 0.5)
    assert {answer for p in played for _, answer in p.turns} == {"L", "R"}
    assert solver_success(task, 1.0, 50) == 0.0


@pytest.mark.parametrize("env", ["goal_walk", "trail"])
def test_the_calibrated_share_gives_the_chosen_success(env):
    task = task_named(env)
    calibrated = mistakes_for(task, 0.4)
    assert 0.05 < calibrated.mistakes < 0.5
    assert 0.4 <= calibrated.success < 0.45
    assert solver_success(task, calibrated.mistakes + 0.01) < 0.4  # the largest such share


@pytest.mark.parametrize("env,context_turns", [("goal_walk", 0), ("follow_signs_longtail", 0),
                                               ("trail_longtail", 1), ("trail_longtail", 3)])
async def test_transcripts_are_the_contexts_the_environment_loop_builds(tiny_model, env, context_turns):
    """The solver's episode replayed through the actor's environment loop on the real environment: every
    context the actor builds (restarted every `context_turns` turns) is one transcript, token for token."""
    chat = ChatTokens(tiny_model)
    renderer = TranscriptRenderer(chat, Limit(4096, "test"))
    task = task_named(env)
    for seed in range(3):
        played = await play(task, seed, 0.3)
        link = CollectingLink()
        runner = EpisodeRunner(actor_id="a", epoch=1, player=EnvironmentLoop(lambda: make_env(env)), chat=chat,
                               client=Replies(chat, [answer for _, answer in played.turns]), link=link,
                               sampling=Sampling(1.0, 16, 4096, context_turns=context_turns),
                               metrics=ActorMetrics(), tasks=TaskSource(RandomOrder(0)))
        outcome = await runner.play("ep", seed=seed)
        assert (outcome == "success") == played.success
        contexts: list[list[int]] = []
        for c in link.chunks:
            if c.turn == 0 or c.context_reset:
                contexts.append([])
            contexts[-1] += np.concatenate([c.obs_tokens, c.gen_tokens]).tolist()
        transcripts = played.transcripts(context_turns)
        assert [renderer.render(1, t).tokens for t in transcripts] == contexts


def test_every_task_weighs_the_same():
    rng = random.Random(0)
    few, many = [{"i": i} for i in range(3)], [{"i": i} for i in range(50)]
    repeated = same_weight(few, 10, rng)
    assert len(repeated) == 10 and all(repeated.count(t) in (3, 4) for t in few)
    drawn = same_weight(many, 10, rng)
    assert len(drawn) == 10 and len({t["i"] for t in drawn}) == 10


def _small_plan(**kw) -> WarmStartPlan:
    return WarmStartPlan([task_named("follow_signs")], episodes=20, task_transcripts=64,
                         phases=(SftPhase(3, 3e-3, 8), SftPhase(2, 3e-4, 16)), **kw)


def test_the_build_is_the_same_for_the_same_seed(tmp_path):
    a = make_reading_model(tmp_path / "a", _small_plan(), seed=0)
    b = make_reading_model(tmp_path / "b", _small_plan(), seed=0)
    c = make_reading_model(tmp_path / "c", _small_plan(), seed=1)
    weights = {name: (tmp_path / name / "model.safetensors").read_bytes() for name in "abc"}
    assert weights["a"] == weights["b"] != weights["c"]
    assert a == b
    task = a["tasks"][0]
    assert (task["env"], task["solver_success"]) == ("follow_signs", 0.4) and 0.1 < task["mistakes"] < 0.4
    assert a["sft"]["steps"] == [3, 2] and a["sft"]["loss_end"] < a["sft"]["loss_start"]
    assert a["sft"]["transcripts"] == 64 and task["over_context"] == 0
    # the model's record of the tasks it was built for, with their settings (`turnstream bench start-success`)
    assert json.loads((tmp_path / "a" / MODEL_INFO).read_text())["warm_start"]["tasks"] == [task]
    assert (tmp_path / "a" / "tokenizer.json").is_file()


def test_contexts_longer_than_the_actors_are_left_out(tmp_path):
    plan = WarmStartPlan([task_named("follow_signs_longtail")], episodes=300, task_transcripts=64,
                         phases=(SftPhase(1, 3e-3, 8),))
    task = make_reading_model(tmp_path / "m", plan, seed=0)["tasks"][0]
    assert 0 < task["over_context"] < task["transcripts"] / 10  # a long corridor now and then


def test_a_fixed_share_of_mistakes_is_taken_as_given(tmp_path):
    report = make_reading_model(tmp_path / "m", _small_plan(mistakes=0.0), seed=0)
    assert (report["tasks"][0]["mistakes"], report["tasks"][0]["solver_success"]) == (0.0, 1.0)


@pytest.mark.parametrize("argv,says", [
    (["--tasks", "goal_walk"], "--tasks only with --warm-start"),
    (["--warm-start", "--tasks", "probe_hang"], "no scripted solver for 'probe_hang'"),
    (["--warm-start", "--tasks", "goal_walk", "--env-args", "goal_walk={\"nope\": 1}"], "--env-args: goal_walk"),
    (["--warm-start", "--env-args", "trail=[1]"], "--env-args 'trail=[1]'"),
    (["--warm-start", "--success", "0"], "--success must be in (0, 1]"),
])
def test_bad_warm_start_options_fail_in_one_line(tmp_path, capsys, argv, says):
    assert cli_main(["make-tiny-model", str(tmp_path / "m"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert not (tmp_path / "m").exists()


def test_the_default_tasks_have_solvers():
    assert set(DEFAULT_TASKS) <= set(SOLVERS)
