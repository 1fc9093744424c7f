"""follow_signs_latency: every step waits a seeded, heavy-tailed latency (read through a fake sleep, never waited
out), and the task stays follow_signs: learnable, the optimal policy's reward is 1."""
from __future__ import annotations

import statistics

import pytest

from turnstream.actors.envs.registry import known_envs, make_env


def _env(**kwargs):
    env = make_env("follow_signs_latency", **kwargs)
    waits: list[float] = []

    async def record(seconds: float) -> None:  # the latency the step would wait, without waiting it
        waits.append(seconds)

    env.sleep = record
    return env, waits


async def _play(env, seed: int, answer) -> float:
    obs = (await env.reset(seed)).observation
    while True:
        step = await env.step(answer(obs))
        if step.done:
            return step.reward
        obs = step.observation


def _follow(obs: str) -> str:
    return obs.split()[-1]


async def test_every_step_waits_a_median_of_0_2_s_and_one_in_ten_ten_times_longer():
    assert "follow_signs_latency" in known_envs()
    env, waits = _env()
    for seed in range(1500):
        await _play(env, seed, _follow)
    assert len(waits) > 4000  # 2-4 steps an episode, each waited once
    assert statistics.median(waits) == pytest.approx(0.2)
    long_share = sum(w == pytest.approx(2.0) for w in waits) / len(waits)
    assert 0.085 <= long_share <= 0.115  # one call in ten, within 3 binomial standard deviations
    assert set(round(w, 6) for w in waits) == {0.2, 2.0}


async def test_the_latencies_are_seeded_per_episode():
    a, waits_a = _env()
    b, waits_b = _env()
    for seed in (3, 4, 5):
        await _play(a, seed, _follow)
    for seed in (3, 4, 5):
        await _play(b, seed, lambda obs: "L")  # the actions do not move the latencies
    assert waits_a == waits_b
    c, waits_c = _env()
    for seed in range(40):
        await _play(c, seed, _follow)
    assert len({tuple(waits_c[i:i + 4]) for i in range(0, len(waits_c) - 4, 4)}) > 1  # seeds differ


async def test_learnable_by_construction_the_optimal_policy_gets_reward_1():
    env, _ = _env()
    assert [await _play(env, seed, _follow) for seed in range(200)] == [1.0] * 200
    # a policy blind to the signs succeeds at 2^-k only
    blind = [await _play(env, seed, lambda obs: "L") for seed in range(400)]
    assert 0.05 < sum(blind) / len(blind) < 0.3


async def test_its_settings_are_checked_and_the_waits_scale_with_them():
    with pytest.raises(ValueError, match="latency_s"):
        make_env("follow_signs_latency", latency_s=0)
    with pytest.raises(ValueError, match="long_share"):
        make_env("follow_signs_latency", long_share=1.5)
    env, waits = _env(latency_s=0.05, long_share=0.0, long_factor=3.0)
    await _play(env, 0, _follow)
    assert waits and set(waits) == {0.05}
