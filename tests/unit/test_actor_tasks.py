"""The actor's task source (actors/tasks/) and the environment's task API: which task each episode plays."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.environment import Environment, Reset, Step
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.context import Sampling
from turnstream.actors.play.env_loop import EnvironmentLoop
from turnstream.actors.envs.registry import make_env
from turnstream.actors.tasks.orders import Assignment, RandomOrder, SequentialOrder, make_order
from turnstream.actors.tasks.source import TaskSource
from turnstream.actors.play.runner import EpisodeRunner
from turnstream.core.config import ConfigError, load_config
from turnstream.checks.preflight import preflight
from tests.unit.fakes import CollectingLink, ScriptedClient, streams


def draws(source, n):
    return [source.next() for _ in range(n)]


# ---- orders and groups ---------------------------------------------------------------------------------

def test_random_order_with_groups_of_one_plays_the_seeds_actors_always_played():
    assert draws(TaskSource(RandomOrder(7)), 5) == [Assignment(7 * 1_000_003 + n) for n in range(5)]


def test_group_size_n_hands_each_draw_to_n_consecutive_episodes():
    got = draws(TaskSource(RandomOrder(7), group_size=3), 9)
    assert got == [Assignment(7 * 1_000_003 + n) for n in range(3) for _ in range(3)]


def epoch_tasks(order, num_tasks, epochs):
    got = [order.draw() for _ in range(num_tasks * epochs)]
    return [[a.task for a in got[e * num_tasks:(e + 1) * num_tasks]] for e in range(epochs)]


def test_sequential_order_visits_every_task_once_per_epoch_in_a_new_order_each_epoch():
    epochs = epoch_tasks(SequentialOrder(10, run_seed=3), 10, 4)
    assert all(sorted(e) == list(range(10)) for e in epochs)
    assert len({tuple(e) for e in epochs}) == 4  # shuffled per epoch


def test_sequential_order_is_deterministic_in_the_run_seed():
    assert epoch_tasks(SequentialOrder(10, run_seed=3), 10, 2) == epoch_tasks(SequentialOrder(10, run_seed=3), 10, 2)
    assert epoch_tasks(SequentialOrder(10, run_seed=3), 10, 2) != epoch_tasks(SequentialOrder(10, run_seed=4), 10, 2)


def test_sequential_order_ends_after_its_epochs_and_shards_split_each_epoch():
    order = SequentialOrder(5, run_seed=0, epochs=2)
    assert [order.draw() is None for _ in range(11)] == [False] * 10 + [True]
    shards = [SequentialOrder(5, run_seed=0, epochs=1, shard=k, num_shards=2) for k in range(2)]
    parts = [[a.task for a in iter(s.draw, None)] for s in shards]
    assert sorted(parts[0] + parts[1]) == list(range(5)) and len(parts[0]) == 3  # positions 0, 2, 4 and 1, 3


def test_sequential_groups_play_each_task_n_times_then_run_out():
    source = TaskSource(SequentialOrder(3, run_seed=1, epochs=1), group_size=2)
    got = [a.task for a in iter(source.next, None)]
    assert len(got) == 6 and got[0::2] == got[1::2] and sorted(set(got)) == [0, 1, 2]


def test_sequential_needs_an_environment_that_enumerates_its_tasks():
    with pytest.raises(ConfigError, match="^tasks.order: sequential needs"):
        make_order("sequential", env_factory=lambda: make_env("trivial"), actor_seed=0, run_seed=0)
    with pytest.raises(ConfigError, match="^tasks.order"):
        preflight(load_config(None, ["tasks.order=sequential", "env.name=trivial"]))
    preflight(load_config(None, ["tasks.order=sequential", "env.name=follow_signs"]))
    with pytest.raises(ConfigError, match="^tasks.epochs"):
        load_config(None, ["tasks.epochs=2"])


# ---- the environment API -------------------------------------------------------------------------------

async def test_follow_signs_enumerates_its_sign_sequences_and_resets_to_the_given_task():
    env = make_env("follow_signs")
    assert env.num_tasks == 4 + 8 + 16
    keys = [(await env.reset(seed=99, task=t)).prompt_key for t in range(env.num_tasks)]
    assert len(set(keys)) == env.num_tasks
    assert keys[0] == "follow_signs/LL" and keys[4] == "follow_signs/LLL" and keys[-1] == "follow_signs/RRRR"
    with pytest.raises(ValueError):
        await env.reset(0, task=env.num_tasks)


async def test_follow_signs_without_a_task_draws_as_it_always_did():
    env = make_env("follow_signs")
    for seed in range(20):
        rng = random.Random(seed)
        k = rng.choice([2, 3, 4])
        signs = "".join(rng.choice("LR") for _ in range(k))
        assert (await env.reset(seed)).prompt_key == f"follow_signs/{signs}"


class SeedOnly(Environment):
    """An environment written before tasks: its reset takes only the seed."""

    async def reset(self, seed: int) -> Reset:  # type: ignore[override]
        self.seed = seed
        return Reset(observation="say something", prompt_key=f"seed-only/{seed}")

    async def step(self, action: str) -> Step:
        return Step(observation="end", reward=0.0, done=True)


def _runner(tiny_model, factory, tasks, link):
    return EpisodeRunner(actor_id="a", epoch=1, player=EnvironmentLoop(factory), chat=ChatTokens(tiny_model),
                         client=ScriptedClient(), link=link, sampling=Sampling(1.0, 16, 512),
                         metrics=ActorMetrics(), tasks=tasks)


async def test_an_environment_that_does_not_enumerate_plays_groups_by_seed(tiny_model):
    link = CollectingLink()
    runner = _runner(tiny_model, SeedOnly, TaskSource(RandomOrder(5), group_size=2), link)
    assert await runner.play("ep", seed=3) == "done"
    for n in range(4):
        assignment = runner.tasks.next()
        assert assignment.task is None
        await runner.play(f"g{n}", seed=assignment.seed, task=assignment.task)
    keys = [s[0].prompt_key for name, s in sorted(streams(link.chunks).items()) if name.startswith("g")]
    assert keys == [f"seed-only/{5 * 1_000_003}"] * 2 + [f"seed-only/{5 * 1_000_003 + 1}"] * 2


async def test_an_actor_alone_completes_whole_groups_of_every_task(tiny_model):
    link = CollectingLink()
    tasks = TaskSource(SequentialOrder(28, run_seed=0, epochs=1), group_size=4)
    runner = _runner(tiny_model, lambda: make_env("follow_signs"), tasks, link)
    await runner.run(concurrent_episodes=3)  # returns when the single epoch has been played
    by_key = Counter(s[0].prompt_key for s in streams(link.chunks).values())
    assert len(by_key) == 28 and set(by_key.values()) == {4}
