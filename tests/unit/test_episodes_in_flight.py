"""Episodes in flight adapt to slow environments: K bound those that want generation, an episode inside an
environment call lets another start, up to the cap; credits follow (play/in_flight.py, play/runner.py)."""
from __future__ import annotations

import asyncio
import time

import pytest

from turnstream.actors.environment import EnvError, Environment, Reset, Step
from turnstream.actors.envs.waiting import not_waiting
from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.context import Sampling
from turnstream.actors.play.env_loop import EnvironmentLoop
from turnstream.actors.play.in_flight import EpisodeGate
from turnstream.actors.play.runner import EpisodeRunner
from turnstream.actors.tasks.orders import SequentialOrder
from turnstream.actors.tasks.source import TaskSource
from turnstream.core.config import Config
from turnstream.core.configtools import ConfigError, from_dict
from tests.unit.fakes import CollectingLink, ScriptedClient


class SlowTool(Environment):
    """Two turns; every step waits `wait_s` on a tool; records the most episodes in flight at once."""

    num_tasks = 10**6
    live = 0
    most_live = 0

    def __init__(self, wait_s: float):
        self.wait_s, self.turns = wait_s, 0

    async def reset(self, seed: int, task: int | None = None) -> Reset:
        SlowTool.live += 1
        SlowTool.most_live = max(SlowTool.most_live, SlowTool.live)
        return Reset("go", f"slow/{seed}")

    async def step(self, action: str) -> Step:
        await asyncio.sleep(self.wait_s)
        self.turns += 1
        return Step("again", 0.0, done=self.turns == 2)

    async def close(self) -> None:
        SlowTool.live -= 1


class Counting(ScriptedClient):
    """A generate that takes `gen_s` and counts how many run at once."""

    def __init__(self, gen_s: float):
        super().__init__()
        self.gen_s, self.now, self.most = gen_s, 0, 0

    async def generate(self, token_ids, **kw):
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(self.gen_s)
            return await super().generate(token_ids, **kw)
        finally:
            self.now -= 1


def _runner(tiny_model, client, link, metrics, episodes: int, wait_s: float) -> EpisodeRunner:
    return EpisodeRunner(actor_id="a", epoch=1, player=EnvironmentLoop(lambda: SlowTool(wait_s)),
                         chat=ChatTokens(tiny_model), client=client, link=link, sampling=Sampling(1.0, 4, 512),
                         metrics=metrics, tasks=TaskSource(SequentialOrder(episodes, run_seed=0, epochs=1)))


@pytest.fixture(autouse=True)
def _reset_counts():
    SlowTool.live = SlowTool.most_live = 0


async def _timed_run(runner: EpisodeRunner, k: int, cap: int) -> float:
    started = time.monotonic()
    await asyncio.wait_for(runner.run(k, cap), 30)
    return time.monotonic() - started


async def test_episodes_waiting_on_a_slow_tool_let_others_start_up_to_the_cap(tiny_model):
    link, metrics = CollectingLink(), ActorMetrics()
    client = Counting(gen_s=0.01)
    runner = _runner(tiny_model, client, link, metrics, episodes=24, wait_s=0.3)
    fixed = await _timed_run(_runner(tiny_model, Counting(0.01), CollectingLink(), ActorMetrics(), 24, 0.3), 4, 4)
    most_fixed = SlowTool.most_live
    SlowTool.most_live = 0
    adaptive = await _timed_run(runner, 4, 16)
    assert most_fixed == 4  # a fixed K: the tool's waits hold the slots
    assert 8 < SlowTool.most_live <= 16  # more than K, up to the cap (which counts environments too)
    assert adaptive < fixed / 2, (adaptive, fixed)  # most of the tool waits overlap
    assert metrics.registry.get_sample_value("turnstream_actor_episodes_total", {"outcome": "done"}) == 24
    assert metrics.registry.get_sample_value("turnstream_actor_episodes_waiting_on_env") == 0
    assert metrics.registry.get_sample_value("turnstream_actor_running_episodes") == 0
    assert link.slots <= 16


async def test_instant_environments_keep_about_k_in_flight(tiny_model):
    """Generation is the slow part: nobody waits on the environment long, so no extra episodes pile up."""
    client = Counting(gen_s=0.01)
    await _timed_run(_runner(tiny_model, client, CollectingLink(), ActorMetrics(), 64, 0.0), 4, 32)
    assert client.most <= 6  # K, and an episode or two coming back from a step while a new one started
    assert SlowTool.most_live <= 8


async def test_every_episode_takes_a_credit_and_the_credits_asked_for_follow_the_gate(tiny_model):
    link = CollectingLink(credits=6)  # the buffer's admission grants six, no more
    runner = _runner(tiny_model, Counting(0.0), link, ActorMetrics(), episodes=64, wait_s=0.5)
    playing = asyncio.create_task(runner.run(2, 16))
    await asyncio.sleep(0.6)
    assert SlowTool.live == 6
    assert link.slots == 6 + 1 + 2  # the six playing, the seventh waiting for its credit, and K to start
    await asyncio.sleep(1.5)
    assert not playing.done()  # parked: the seventh episode has no credit
    assert SlowTool.most_live == 6 and SlowTool.live == 0
    assert link.slots == 1 + 2
    playing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await playing


async def test_an_episode_the_runner_did_not_start_is_not_counted(tiny_model):
    """runner.play (an evaluation round's episodes, a test's) marks its environment calls at no gate."""
    metrics = ActorMetrics()
    runner = _runner(tiny_model, Counting(0.0), CollectingLink(), metrics, episodes=1, wait_s=0.05)
    assert await runner.play("ev", seed=1) == "done"
    assert metrics.registry.get_sample_value("turnstream_actor_episodes_waiting_on_env") == 0


async def test_the_gate_admits_while_fewer_than_k_want_generation_and_fewer_than_cap_are_in_flight():
    gate = EpisodeGate(2, 3, grace_s=0.05)
    await gate.enter()
    await gate.enter()
    assert not gate.has_room() and gate.slots() == 3
    async with gate.waiting():
        assert not gate.has_room()  # a call that returns at once never counts
        await asyncio.sleep(0.1)
        assert gate.generating == 1 and gate.has_room()
        await gate.enter()
        assert not gate.has_room()  # the cap
    gate.leave()
    assert gate.in_flight == 2 and not gate.has_room()
    with pytest.raises(ValueError):
        EpisodeGate(4, 3)


async def test_a_wait_for_room_to_run_the_environment_makes_no_room_for_another_episode():
    """With every environment worker down, episodes wait for one inside their reset: counted as waiting on the
    environment, they would let more start, all to land on the next worker (and die with it)."""
    gate = EpisodeGate(1, 8, grace_s=0.05)
    await gate.enter()
    async with gate.waiting():
        with not_waiting():  # the pool, waiting for a worker to serve the episode
            await asyncio.sleep(0.1)
            assert gate.waiting_on_env == 0 and not gate.has_room()
        assert not gate.has_room()  # the environment call itself starts now: counted after its grace
        await asyncio.sleep(0.1)
        assert gate.waiting_on_env == 1 and gate.has_room()
    assert gate.waiting_on_env == 0
    with not_waiting():  # outside any gate: nothing to pause
        pass


def test_max_episodes_in_flight_below_k_is_a_config_error():
    with pytest.raises(ConfigError, match="^actor.max_episodes_in_flight: 4 is below concurrent_episodes"):
        from_dict(Config, {"actor": {"concurrent_episodes": 8, "max_episodes_in_flight": 4}})
    assert from_dict(Config, {"actor": {"concurrent_episodes": 8}}).actor.in_flight_cap() == 64
    assert from_dict(Config, {"actor": {"concurrent_episodes": 8,
                                        "max_episodes_in_flight": 8}}).actor.in_flight_cap() == 8


class FailsAtSecondStep(SlowTool):
    async def step(self, action: str) -> Step:
        if self.turns == 1:
            raise EnvError("the tool's sandbox crashed", "worker_died")
        return await super().step(action)


async def test_an_episode_abandoned_after_it_streamed_keeps_asking_for_its_credit_until_the_buffer_drops_it(
        tiny_model):
    """The buffer counts it running (against this actor's credits) until its episode timeout: without the extra
    ask, a burst of abandoned episodes would starve the actor of credits for that long."""
    link = CollectingLink()
    runner = EpisodeRunner(actor_id="a", epoch=1, player=EnvironmentLoop(lambda: FailsAtSecondStep(0.0)),
                           chat=ChatTokens(tiny_model), client=Counting(0.0), link=link,
                           sampling=Sampling(1.0, 4, 512), metrics=ActorMetrics(),
                           tasks=TaskSource(SequentialOrder(10, run_seed=0, epochs=1)))
    await asyncio.wait_for(runner.run(2, 8, buffer_expiry_s=30.0), 30)
    assert len(link.chunks) == 10  # each streamed its first turn, then failed
    assert link.slots == 2 + 10  # K, and the ten the buffer still counts

    gate = EpisodeGate(2, 8, buffer_expiry_s=0.1)
    gate.abandoned_midway()
    assert gate.slots() == 3
    await asyncio.sleep(0.15)
    assert gate.slots() == 2
