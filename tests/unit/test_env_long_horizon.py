"""trail and trail_longtail (actors/envs/tasks/trail.py): the long-horizon task. Rewards along the way and a terminal
bonus, the turn budget, tasks, the long tail's lengths, random against optimal play, and the tokens a whole
episode takes through the actor's runner and chat template."""
from __future__ import annotations

import random
import statistics

import pytest

from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.context import Sampling
from turnstream.actors.play.env_loop import EnvironmentLoop
from turnstream.actors.envs.registry import describe, known_envs, make_env
from turnstream.actors.tasks.orders import RandomOrder
from turnstream.actors.tasks.source import TaskSource
from turnstream.actors.play.runner import EpisodeRunner
from turnstream.actors.envs.tasks.trail import Trail
from tests.unit.fakes import CollectingLink, ScriptedClient, streams

MAX_MODEL_LEN = 1024  # benchmarks/async_vs_sync.py's, which bench learning uses too


def _other(sign: str) -> str:
    return "R" if sign == "L" else "L"


def _follow(obs: str) -> str:
    return obs.split()[-1]  # "37 L": the sign


def _noisy(p: float, rng: random.Random):
    """Follows the observation's sign with probability p, else answers the other side."""
    return lambda obs: _follow(obs) if rng.random() < p else _other(_follow(obs))


async def _play(env, answer, seed: int = 0, task: int | None = None) -> list:
    """Plays one episode; `answer(observation)` picks the action. Returns every Step."""
    obs, steps = (await env.reset(seed, task)).observation, []
    while not (steps and steps[-1].done):
        steps.append(await env.step(answer(obs)))
        obs = steps[-1].observation
    return steps


async def _stats(env, answer, episodes: int) -> tuple[float, float, float]:
    """Mean return, success rate and mean turns over `episodes` episodes, tasks in turn."""
    runs = [await _play(env, answer, seed=i, task=i % env.num_tasks) for i in range(episodes)]
    return (statistics.mean(sum(s.reward for s in r) for r in runs),
            statistics.mean(r[-1].info["success"] for r in runs), statistics.mean(len(r) for r in runs))


async def test_registered_with_tasks_and_prompt_keys():
    assert {"trail", "trail_longtail"} <= set(known_envs())
    assert "50 turns and more" in describe("trail") and "long-tailed" in describe("trail_longtail")
    env = make_env("trail")
    assert env.num_tasks == 64 and env.action_tokens == ["L", "R"] and env.max_action_tokens == 1
    keys = {(await env.reset(0, task=t)).prompt_key for t in range(64)}
    assert keys == {f"trail/{t}" for t in range(64)}
    assert len({env.task_signs(t) for t in range(64)}) == 64
    with pytest.raises(ValueError):
        await env.reset(0, task=64)
    assert (await make_env("trail_longtail").reset(0, task=3)).prompt_key == "trail_longtail/3"


async def test_deterministic_per_task_and_the_seed_picks_a_task_without_one():
    a, b = make_env("trail"), make_env("trail")
    for task in range(10):
        await a.reset(1, task=task)
        await b.reset(99, task=task)  # the seed changes nothing once the task is named
        assert a.signs == b.signs == a.task_signs(task) and len(a.signs) == 50
    assert set(a.task_signs(0)) == {"L", "R"}
    picked = [(await a.reset(s)).prompt_key for s in range(200)]
    assert picked == [(await b.reset(s)).prompt_key for s in range(200)]
    assert len(set(picked)) > 50  # seeds spread over the 64 tasks
    reset = await a.reset(5)
    assert a.signs == a.task_signs(int(reset.prompt_key.split("/")[1]))


async def test_a_reward_per_marker_and_the_bonus_at_the_end():
    env = make_env("trail")
    steps = await _play(env, _follow, task=7)
    assert len(steps) == 50 and steps[-1].done and not steps[-1].truncated and steps[-1].info == {"success": True}
    assert [s.reward for s in steps[:-1]] == [pytest.approx(0.01)] * 49
    assert steps[-1].reward == pytest.approx(0.51)  # the last marker's 0.01 and the bonus
    assert sum(s.reward for s in steps) == pytest.approx(1.0)
    assert all(not s.done and s.info is None for s in steps[:-1])
    # the observation counts down the turns left in the budget and shows the next sign
    signs = env.task_signs(7)
    assert (await env.reset(0, task=7)).observation == f"60 {signs[0]}"
    assert [s.observation for s in steps[:3]] == [f"59 {signs[1]}", f"58 {signs[2]}", f"57 {signs[3]}"]
    custom = make_env("trail", length=4, bonus=0.2)
    assert [s.reward for s in await _play(custom, _follow)] == pytest.approx([0.2, 0.2, 0.2, 0.4])


async def test_a_wrong_answer_costs_a_turn_not_the_episode():
    env = make_env("trail")
    obs = (await env.reset(0, task=2)).observation
    step = await env.step(_other(obs.split()[-1]))
    assert obs == f"60 {obs.split()[-1]}"
    assert step.reward == 0.0 and not step.done and step.observation == f"59 {obs.split()[-1]}"  # the same marker
    assert (await env.step("left")).observation == f"58 {obs.split()[-1]}"  # anything but the sign is wrong
    # always wrong: the budget (50 + 20% = 60 turns) ends it, a task's end rather than a cut
    steps = await _play(env, lambda o: _other(_follow(o)), task=2)
    assert len(steps) == 60 and steps[-1].done and not steps[-1].truncated
    assert steps[-1].info == {"success": False} and sum(s.reward for s in steps) == 0.0


async def test_the_budget_allows_slack_mistakes_and_no_more():
    env = make_env("trail")
    for mistakes, success in ((10, True), (11, False)):
        left = iter(range(mistakes))
        steps = await _play(env, lambda o: _other(_follow(o)) if next(left, None) is not None else _follow(o))
        assert len(steps) == 60 and steps[-1].info["success"] is success
        # without the bonus: 49 markers at 0.01
        assert sum(s.reward for s in steps) == pytest.approx(1.0 if success else 0.49)
    assert make_env("trail", length=10, slack=0.25).budget(10) == 13  # rounded up
    assert make_env("trail", slack=0).budget(50) == 50


async def test_random_play_earns_far_less_than_following_the_signs():
    """The module docstring's numbers (20,000 episodes each there, 3,000 here)."""
    env, rng = make_env("trail"), random.Random(0)
    ret, success, turns = await _stats(env, lambda obs: rng.choice("LR"), 3000)
    assert ret == pytest.approx(0.30, abs=0.01) and success < 0.002 and turns == pytest.approx(60, abs=0.01)
    assert await _stats(env, _follow, 64) == (pytest.approx(1.0), 1.0, 50)
    ret, success, turns = await _stats(env, _noisy(0.9, random.Random(1)), 3000)
    assert ret == pytest.approx(0.98, abs=0.01) and success == pytest.approx(0.966, abs=0.015)
    assert turns == pytest.approx(55.5, abs=0.3)
    ret, success, _ = await _stats(env, _noisy(0.8, random.Random(2)), 3000)
    assert ret == pytest.approx(0.64, abs=0.03) and success == pytest.approx(0.32, abs=0.04)


async def test_longtail_one_task_in_ten_is_five_times_as_long():
    env = make_env("trail_longtail")
    lengths = [len(env.task_signs(t)) for t in range(env.num_tasks)]
    assert sorted(set(lengths)) == [10, 50] and lengths.count(50) == 6 == len(env.long_tasks)
    optimal = [len(await _play(env, _follow, task=t)) for t in range(env.num_tasks)]
    assert optimal == lengths
    # episodes as the actors draw them (a task from each seed): about one in ten is long
    drawn = []
    for seed in range(2000):
        await env.reset(seed)
        drawn.append(len(env.signs))
    assert 0.07 < drawn.count(50) / len(drawn) < 0.12
    rng = random.Random(0)
    turns = [len(await _play(env, lambda obs: rng.choice("LR"), task=t)) for t in range(env.num_tasks)]
    assert {turns[t] for t in env.long_tasks} == {60} and statistics.median(turns) == 12
    ret, success, mean_turns = await _stats(env, _noisy(0.5, random.Random(3)), 3000)
    assert ret == pytest.approx(0.31, abs=0.015) and success < 0.04 and mean_turns == pytest.approx(16.5, abs=0.2)
    assert (await _stats(env, _noisy(0.9, random.Random(4)), 3000))[1] == pytest.approx(0.90, abs=0.02)
    # the same tail on `trail` by its arguments; without them, no long task
    same = make_env("trail", length=10, long_length=50)
    assert sorted(len(same.task_signs(t)) for t in range(64)) == sorted(lengths)
    assert not make_env("trail").long_tasks


def test_bad_arguments_are_refused():
    for kwargs in ({"length": 0}, {"slack": -1}, {"bonus": 1.5}, {"tasks": 0}, {"long_length": -1},
                   {"long_fraction": 2}):
        with pytest.raises(ValueError):
            Trail(**kwargs)


class _Follower(ScriptedClient):
    """Answers the sign at the end of the context it is given (the last observation)."""

    def __init__(self, chat: ChatTokens):
        super().__init__()
        self.chat = chat

    async def generate(self, token_ids, **kwargs):
        gen = await super().generate(token_ids, **kwargs)
        *_, sign, assistant = self.chat.decode(token_ids).split()  # "... 50 L assistant"
        assert assistant == "assistant"
        gen.tokens = [self.chat.single_token_id(sign)]
        return gen


async def test_whole_episodes_fit_the_context_through_the_runner(tiny_model):
    """648 tokens for a perfect episode (50 turns), 778 for a spent budget (60): 13 a turn, 2 per observation."""
    chat = ChatTokens(tiny_model)
    for client, turns, outcome in ((_Follower(chat), 50, "success"), (ScriptedClient(seed=0), 60, "done")):
        link = CollectingLink()
        runner = EpisodeRunner(actor_id="a", epoch=1, player=EnvironmentLoop(lambda: make_env("trail")), chat=chat,
                               client=client, link=link, sampling=Sampling(1.0, 16, MAX_MODEL_LEN),
                               metrics=ActorMetrics(), tasks=TaskSource(RandomOrder(0)))
        assert await runner.play("ep", seed=0, task=0) == outcome
        chunks = streams(link.chunks)["ep"]
        assert len(chunks) == turns and all(c.gen_tokens.size == 1 for c in chunks)
        tokens = sum(c.obs_tokens.size + c.gen_tokens.size for c in chunks)
        assert tokens == 13 * turns - 2 and len(client.calls[-1]) == tokens - 1 < MAX_MODEL_LEN
        # the chat template's 8 tokens around the first observation, 10 around the others, and 2 for each
        assert [c.obs_tokens.size for c in chunks] == [10] + [12] * (turns - 1)
    assert {len(chat.encode(f"{n} {s}")) for n in range(1, 61) for s in "LR"} == {2}  # any observation
