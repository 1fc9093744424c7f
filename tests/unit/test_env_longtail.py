"""follow_signs_longtail: seeded, long-tailed episode lengths, reward from the junctions only."""
from __future__ import annotations

import random
import statistics

import pytest

from turnstream.actors.envs.registry import known_envs, make_env
from turnstream.actors.envs.tasks.follow_signs_longtail import corridor_length


async def _layout(env, seed: int) -> tuple[str, list]:
    reset = await env.reset(seed)
    return reset.prompt_key, list(env.plan)


async def _play(env, seed: int, answer) -> list:
    """Plays one episode; `answer(observation)` picks the action. Returns every Step."""
    obs = (await env.reset(seed)).observation
    steps = []
    while True:
        step = await env.step(answer(obs))
        steps.append(step)
        if step.done:
            return steps
        obs = step.observation


def _follow(obs: str) -> str:
    return obs.split()[-1] if "sign" in obs and "no sign" not in obs else "L"


async def test_registered_and_deterministic_by_seed():
    assert "follow_signs_longtail" in known_envs()
    a, b = make_env("follow_signs_longtail"), make_env("follow_signs_longtail")
    layouts = [await _layout(a, s) for s in range(50)]
    assert layouts == [await _layout(b, s) for s in range(50)]
    assert len(set(map(str, layouts))) > 30  # different seeds, different episodes


async def test_lengths_are_long_tailed():
    env = make_env("follow_signs_longtail")
    lengths = []
    for seed in range(3000):
        await env.reset(seed)
        lengths.append(env.num_turns)
    lengths.sort()
    median = statistics.median(lengths)
    p99 = lengths[int(0.99 * len(lengths))]
    assert 3 <= median <= 4
    assert p99 >= 5 * median  # the slowest episodes of a batch are several times the median
    assert statistics.mean(lengths) > median + 0.4  # skewed to the right, not symmetric noise
    assert sum(n >= 4 * median for n in lengths) > 0.02 * len(lengths)  # most batches of 64 hold one
    assert max(lengths) == 4 + 24  # capped: at most max(junctions) + max_corridor turns


def test_corridor_tail_matches_the_lomax_survival_function():
    rng = random.Random(0)
    draws = [corridor_length(rng, 1.5, 1.2, 10_000) for _ in range(20_000)]
    for x in (1, 5, 20):
        expected = (1 + x / 1.5) ** -1.2
        observed = sum(d >= x for d in draws) / len(draws)
        assert abs(observed - expected) < 0.02, (x, observed, expected)


async def test_reward_comes_from_the_junctions_only():
    env = make_env("follow_signs_longtail")
    for seed in range(40):
        steps = await _play(env, seed, _follow)
        signs = [s for s in env.plan if s is not None]
        assert len(steps) == env.num_turns and env.plan[-1] is not None  # ends on a junction
        assert [s.reward for s in steps[:-1]] == [0.0] * (len(steps) - 1)
        assert steps[-1].reward == 1.0 and steps[-1].info["success"]
        assert env.signs == "".join(signs)
        # the other corridor answer changes nothing
        assert (await _play(env, seed, lambda o: "R" if "no sign" in o else _follow(o)))[-1].reward == 1.0
        # one wrong junction (the first) fails the episode
        wrong = iter([True])

        def wrong_once(obs: str) -> str:
            if "no sign" not in obs and next(wrong, False):
                return "R" if obs.endswith("L") else "L"
            return _follow(obs)

        last = (await _play(env, seed, wrong_once))[-1]
        assert last.reward == 0.0 and not last.info["success"]


async def test_prompt_key_names_the_signs_and_rejects_bad_args():
    env = make_env("follow_signs_longtail", junctions=[3], max_corridor=0)
    reset = await env.reset(1)
    assert reset.prompt_key == f"follow_signs_longtail/{env.signs}" and env.num_turns == 3
    with pytest.raises(ValueError):
        make_env("follow_signs_longtail", corridor_alpha=0)
