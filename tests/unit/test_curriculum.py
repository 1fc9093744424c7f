"""SPO's curriculum (tasks.order = spo): the weight rule, the values the learner announces, the order's draws."""
from __future__ import annotations

import asyncio
import math
from collections import Counter
from types import SimpleNamespace

import pytest
import zmq
import zmq.asyncio

from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.tasks.curriculum import PRIOR_VALUE, TrackerValues, follow_announcements, spo_weight
from turnstream.actors.tasks.orders import SpoOrder, make_order
from turnstream.actors.tasks.source import TaskSource
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.context import Sampling
from turnstream.actors.play.env_loop import EnvironmentLoop
from turnstream.actors.envs.registry import make_env
from turnstream.actors.play.runner import EpisodeRunner
from turnstream.core.config import ConfigError, LearnerSection, load_config
from turnstream.learner.serve import changed_values
from turnstream.learner.estimators.registry import estimator_for
from turnstream.protocol.codec import decode, encode
from turnstream.protocol.messages import VersionAnnouncement
from turnstream.protocol.sockets import subscriber
from tests.unit.fakes import CollectingLink, ScriptedClient


def announce(version: int, values: dict[str, float]) -> VersionAnnouncement:
    return VersionAnnouncement(version, prompt_keys=list(values), prompt_values=list(values.values()))


def test_the_weight_is_the_bernoulli_std_plus_the_floor():
    assert spo_weight(0.5, 0.05) == pytest.approx(0.55)
    assert spo_weight(1.0, 0.05) == pytest.approx(0.05) and spo_weight(0.0, 0.05) == pytest.approx(0.05)
    assert spo_weight(0.9, 0.05) == pytest.approx(math.sqrt(0.09) + 0.05)


def test_tracker_values_take_announcements_and_refuse_mismatched_lists():
    values = TrackerValues()
    assert values.apply(announce(1, {"a": 0.2, "b": 0.9})) and values.values == {"a": 0.2, "b": 0.9}
    assert values.apply(announce(2, {"a": 0.4})) and values.values == {"a": 0.4, "b": 0.9}
    assert values.changes == 2
    assert not values.apply(VersionAnnouncement(3, prompt_keys=["a"], prompt_values=[]))
    assert not values.apply(VersionAnnouncement(3, prompt_keys=["a"], prompt_values=[1.5]))
    assert values.values == {"a": 0.4, "b": 0.9} and values.changes == 2


def test_the_announcement_carries_the_values_over_the_wire():
    msg = decode(encode(announce(7, {"x/1": 0.25, "x/2": 1.0})))
    assert (msg.version, msg.prompt_keys, msg.prompt_values) == (7, ["x/1", "x/2"], [0.25, 1.0])
    assert decode(encode(VersionAnnouncement(8))).prompt_keys == []  # an older learner sends none


def test_unplayed_tasks_weigh_as_the_prior_and_played_ones_by_their_prompts_values():
    values = TrackerValues()
    order = SpoOrder(range(4), values, epsilon=0.05, actor_seed=0)
    assert set(Counter(order.draw().task for _ in range(4000))) == {0, 1, 2, 3}
    order.played(0, ["k/0"])
    order.played(1, ["k/1/a0", "k/1/a1"])  # a two-agent task: the mean of its agents' values
    values.apply(announce(1, {"k/0": 1.0, "k/1/a0": 0.2, "k/1/a1": 0.6}))
    assert order.task_value(0) == 1.0 and order.task_value(1) == pytest.approx(0.4)
    assert order.task_value(2) == PRIOR_VALUE
    drawn = Counter(order.draw().task for _ in range(20_000))
    weights = [spo_weight(1.0, 0.05), spo_weight(0.4, 0.05), spo_weight(0.5, 0.05), spo_weight(0.5, 0.05)]
    for task, w in enumerate(weights):
        assert drawn[task] / 20_000 == pytest.approx(w / sum(weights), abs=0.015)


def test_each_draw_gets_a_fresh_seed_and_the_order_is_reproducible():
    a = SpoOrder([3, 5, 9], TrackerValues(), epsilon=0.05, actor_seed=11)
    b = SpoOrder([3, 5, 9], TrackerValues(), epsilon=0.05, actor_seed=11)
    got = [a.draw() for _ in range(50)]
    assert got == [b.draw() for _ in range(50)]
    assert len({x.seed for x in got}) == 50 and {x.task for x in got} == {3, 5, 9}


def test_spo_order_needs_enumeration_and_the_spo_estimator():
    with pytest.raises(ConfigError, match="^tasks.order: spo needs"):
        make_order("spo", env_factory=lambda: make_env("trivial"), actor_seed=0, run_seed=0)
    assert isinstance(make_order("spo", env_factory=lambda: make_env("fixed_odds"), actor_seed=0, run_seed=0),
                      SpoOrder)
    with pytest.raises(ConfigError, match="^tasks.order"):
        load_config(None, ["tasks.order=spo", "learner.estimator=turn_gae"])
    load_config(None, ["tasks.order=spo", "learner.estimator=spo"])


async def test_the_runner_tells_the_order_which_prompt_keys_a_task_produced(tiny_model):
    order = SpoOrder(range(4), TrackerValues(), epsilon=0.05, actor_seed=0)
    runner = EpisodeRunner(actor_id="a", epoch=1, player=EnvironmentLoop(lambda: make_env("fixed_odds")),
                           chat=ChatTokens(tiny_model), client=ScriptedClient(), link=CollectingLink(credits=12),
                           sampling=Sampling(1.0, 4, 512), metrics=ActorMetrics(), tasks=TaskSource(order))
    slots = asyncio.ensure_future(runner.run(concurrent_episodes=2))
    await asyncio.sleep(0.5)  # twelve one-turn episodes, then the slots wait for credits
    slots.cancel()
    assert order.keys and all(keys == (f"fixed_odds/{task}",) for task, keys in order.keys.items())


def test_the_learner_announces_the_values_of_the_prompts_its_step_folded_in():
    spo = estimator_for(LearnerSection(estimator="spo"))
    spo.tracker.update("p/1", 1.0, 0.0)
    batch = SimpleNamespace(prompt_keys=["p/1", "p/2", "p/1"])
    assert changed_values(SimpleNamespace(estimator=spo), batch) == {"p/1": spo.tracker.value("p/1"), "p/2": 0.5}
    grpo = estimator_for(LearnerSection(estimator="grpo"))
    assert changed_values(SimpleNamespace(estimator=grpo), batch) == {}


async def test_an_actor_follows_the_learners_announcements_over_zeromq():
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sub = subscriber(ctx, f"tcp://127.0.0.1:{port}")
    values, metrics = TrackerValues(), ActorMetrics()
    follower = asyncio.create_task(follow_announcements(sub, values, metrics, 1 << 20))
    try:
        for _ in range(100):  # PUB drops what it sends before the subscription has arrived
            await pub.send_multipart(encode(announce(1, {"a": 0.75})))
            await asyncio.sleep(0.02)
            if values.values:
                break
        assert values.values == {"a": 0.75}
        await pub.send_multipart(encode(VersionAnnouncement(2, prompt_keys=["b"], prompt_values=[0.1, 0.2])))
        await pub.send_multipart([b"not msgpack"])
        await pub.send_multipart(encode(announce(3, {"c": 0.0})))
        for _ in range(100):
            await asyncio.sleep(0.02)
            if "c" in values.values:
                break
        assert values.values == {"a": 0.75, "c": 0.0}  # the malformed ones are skipped, the follower goes on
        assert metrics.bad_messages.labels("bad_values")._value.get() == 1
        assert metrics.bad_messages.labels("bad_header")._value.get() == 1
        assert metrics.tracker_values._value.get() == 2
    finally:
        follower.cancel()
        ctx.destroy(linger=0)
