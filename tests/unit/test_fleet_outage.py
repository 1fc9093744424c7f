"""A generate request outlives a short loss of every vLLM server: it retries with a jittered, capped back-off on any
server that answers, while its episode and the episode's environment wait, until its deadline
(`actor.request_timeout_s` from its first try); a longer outage fails it with a message that says so. Real aiohttp
servers (tests/unit/fake_vllm.py) on ports that refuse connections while they are down."""
from __future__ import annotations

import asyncio
import random
import time

import pytest

from turnstream.actors.environment import Step
from turnstream.actors.envs.probes.trivial import Trivial
from turnstream.actors.inference.backoff import RetryBackoff
from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.inference.client import InferenceError
from turnstream.actors.inference.fleet import InferenceFleet
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.context import Sampling
from turnstream.actors.play.env_loop import EnvironmentLoop
from turnstream.actors.play.runner import ABANDONED, EpisodeRunner
from turnstream.actors.tasks.orders import RandomOrder
from turnstream.actors.tasks.source import TaskSource
from turnstream.launch.processes import free_port
from tests.helpers import until
from tests.unit.fake_vllm import FakeVllm
from tests.unit.fakes import CollectingLink

OUTAGE_S = 1.5
RETRIES = "turnstream_actor_inference_retries_total"
GIVE_UPS = "turnstream_actor_inference_give_ups_total"


def _count(metrics: ActorMetrics, name: str) -> float:
    return metrics.registry.get_sample_value(name) or 0.0


class OutageAfterFirstTurn(Trivial):
    """Three turns; its first step takes every server down (the link of the actor's host is cut while the
    environment steps) and brings one back `OUTAGE_S` later, on the same address."""

    def __init__(self, down: list[FakeVllm], back: FakeVllm, port: int):
        super().__init__(turns=3)
        self.down, self.back, self.port = down, back, port
        self.back_up: asyncio.Task | None = None

    async def step(self, action: str) -> Step:
        if self.turn == 0:
            for server in self.down:
                await server.stop()
            self.back_up = asyncio.create_task(self._come_back())
        return await super().step(action)

    async def _come_back(self) -> None:
        await asyncio.sleep(OUTAGE_S)
        await self.back.start(self.port)


async def test_an_episode_waits_out_a_loss_of_every_server_and_is_not_lost(tiny_model):
    a, b = await FakeVllm("a").start(), await FakeVllm("b").start()
    b_port = int(b.url.rsplit(":", 1)[1])
    env = OutageAfterFirstTurn([a, b], back=b, port=b_port)
    metrics, link = ActorMetrics(), CollectingLink()
    try:
        # no health checks: the request itself finds the server that answers again
        async with InferenceFleet([a.url, b.url], timeout_s=20.0, health_interval_s=0, metrics=metrics,
                                  retry_first_delay_s=0.1, retry_max_delay_s=0.5) as fleet:
            runner = EpisodeRunner(actor_id="a", epoch=1, player=EnvironmentLoop(lambda: env),
                                   chat=ChatTokens(tiny_model), client=fleet, link=link,
                                   sampling=Sampling(1.0, 4, 512), metrics=metrics,
                                   tasks=TaskSource(RandomOrder(0)))
            started = time.monotonic()
            outcome = await runner.play("ep", seed=0)
            waited = time.monotonic() - started
    finally:
        await a.stop()
        await b.stop()
    assert outcome == "done" and outcome not in ABANDONED
    assert [c.turn for c in link.chunks] == [0, 1, 2] and link.chunks[-1].done
    assert all(len(c.gen_tokens) == 4 for c in link.chunks)  # every turn sampled, none cut short
    assert b.served >= 2  # the turns after the outage came from the server that came back
    assert waited >= OUTAGE_S
    assert _count(metrics, RETRIES) >= 2 and _count(metrics, GIVE_UPS) == 0
    assert _count(metrics, "turnstream_actor_inference_errors_total") == 0


async def test_an_outage_past_the_deadline_fails_the_request_with_a_clear_message():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: every connection is refused
    metrics = ActorMetrics()
    async with InferenceFleet([url], timeout_s=1.0, health_interval_s=0, metrics=metrics) as fleet:
        started = time.monotonic()
        with pytest.raises(InferenceError) as failed:
            await fleet.generate([1, 2, 3], max_tokens=2, temperature=1.0)
        took = time.monotonic() - started
    message = str(failed.value)
    assert message.startswith("no vLLM server could serve the request within actor.request_timeout_s (1 s")
    assert url in message and "Cannot connect" in message  # the last error, naming the server
    assert 1.0 <= took < 2.0  # the deadline counts from the first try, not per try
    assert _count(metrics, RETRIES) >= 2 and _count(metrics, GIVE_UPS) == 1


async def test_a_bad_request_is_not_retried_however_long_the_deadline():
    server = await FakeVllm("a").start()
    server.fail_status = 400
    metrics = ActorMetrics()
    try:
        async with InferenceFleet([server.url], timeout_s=30.0, health_interval_s=0, metrics=metrics) as fleet:
            started = time.monotonic()
            with pytest.raises(InferenceError, match="HTTP 400"):
                await fleet.generate([1, 2, 3], max_tokens=2, temperature=1.0)
            assert time.monotonic() - started < 1.0
            assert fleet.servers[server.url].healthy
    finally:
        await server.stop()
    assert len(server.models) == 1 and _count(metrics, RETRIES) == 0 and _count(metrics, GIVE_UPS) == 0


async def test_a_server_back_with_weights_behind_the_bound_gets_no_retry_until_it_is_resynced():
    """The learner moved on during the outage: the server that answers again still serves weights more than
    max_staleness versions old, whose tokens the buffer would drop, so the request waits for the re-sync."""
    server = await FakeVllm("a").start()
    port = int(server.url.rsplit(":", 1)[1])
    learner = {"version": 0}
    try:
        async with InferenceFleet([server.url], timeout_s=20.0, health_interval_s=0.05, max_staleness=4,
                                  learner_version=lambda: learner["version"]) as fleet:
            await fleet.check_health()
            await server.stop()
            pending = asyncio.create_task(fleet.generate([1, 2, 3], max_tokens=2, temperature=1.0))
            await until(lambda: not fleet.servers[server.url].healthy, "the server marked down")
            learner["version"] = 10
            server.version = "3"  # it missed the pushes
            await server.start(port)
            await until(lambda: fleet.servers[server.url].version == 3, "the health check reads version 3")
            await asyncio.sleep(0.5)
            assert not pending.done() and server.served == 0
            server.version = "9"  # the learner's re-sync
            gen = await pending
    finally:
        await server.stop()
    assert gen.versions == [9, 9] and server.served == 1


def test_back_off_is_jittered_capped_and_grows():
    def delays(seed: int) -> list[float]:
        backoff = RetryBackoff(first_s=0.25, max_s=4.0, rng=random.Random(seed))
        return [backoff.next_delay() for _ in range(12)]

    one, other = delays(1), delays(2)
    assert one != other  # jittered: requests that failed together do not retry together
    nominal = [min(4.0, 0.25 * 2 ** i) for i in range(12)]
    assert all(n / 2 <= d <= n for d, n in zip(one, nominal))
    assert max(one) <= 4.0 and one[-1] >= 2.0  # capped, and at the cap it stays there
