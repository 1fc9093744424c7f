"""The inference fleet against in-process fake servers: balancing, failover, health, membership, staleness."""
from __future__ import annotations

import asyncio

import pytest

from turnstream.actors.inference.fleet import InferenceFleet
from turnstream.actors.inference.client import InferenceError
from turnstream.actors.metrics import ActorMetrics
from tests.helpers import until
from tests.unit.fake_vllm import FakeVllm


@pytest.fixture
async def pair():
    a, b = await FakeVllm("a").start(), await FakeVllm("b").start()
    yield a, b
    await a.stop()
    await b.stop()


def _fleet(servers, **kw) -> InferenceFleet:
    kw.setdefault("health_interval_s", 0)  # tests call check_health() themselves
    kw.setdefault("timeout_s", 5.0)
    return InferenceFleet([s.url for s in servers], metrics=kw.pop("metrics", ActorMetrics()), **kw)


async def _gen(fleet, n=2):
    return await fleet.generate([1, 2, 3], max_tokens=n, temperature=1.0)


async def test_least_outstanding_requests(pair):
    a, b = pair
    a.gate, b.gate = asyncio.Event(), asyncio.Event()
    async with _fleet(pair) as fleet:
        first = [asyncio.create_task(_gen(fleet)) for _ in range(4)]
        await until(lambda: a.in_flight + b.in_flight == 4)
        assert (a.in_flight, b.in_flight) == (2, 2)  # spread evenly
        b.gate.set()  # b finishes its two; a still holds two
        await until(lambda: b.served == 2)
        more = [asyncio.create_task(_gen(fleet)) for _ in range(2)]
        await asyncio.gather(*more)
        assert b.served == 4 and a.served == 0  # new work went to the server with nothing outstanding
        a.gate.set()
        await asyncio.gather(*first)


async def test_failed_server_is_retried_elsewhere_and_comes_back(pair):
    a, b = pair
    metrics = ActorMetrics()
    a.fail_status = 500
    async with _fleet(pair, metrics=metrics) as fleet:
        gens = [await _gen(fleet) for _ in range(6)]
        assert all(g.tokens == [7, 7] for g in gens)
        assert b.served == 6 and not fleet.servers[a.url].healthy
        assert metrics.registry.get_sample_value("turnstream_actor_inference_retries_total") >= 1
        a.fail_status = 0
        await fleet.check_health()
        assert fleet.servers[a.url].healthy
        await asyncio.gather(*(_gen(fleet) for _ in range(6)))
        assert a.served >= 1


async def test_dead_server_and_garbage_replies_fail_over(pair):
    a, b = pair
    async with _fleet(pair, timeout_s=1.0) as fleet:
        await a.stop()  # connection refused from now on
        for _ in range(4):
            assert (await _gen(fleet)).tokens == [7, 7]
        await fleet.check_health()
        assert not fleet.servers[a.url].healthy
        b.garbage = True  # b answers malformed JSON: no server left -> the request fails cleanly
        with pytest.raises(InferenceError, match="no vLLM server"):
            await _gen(fleet)


async def test_client_error_is_not_retried(pair):
    a, b = pair
    a.fail_status = b.fail_status = 400
    async with _fleet(pair) as fleet:
        with pytest.raises(InferenceError, match="HTTP 400"):
            await _gen(fleet)
        assert all(s.healthy for s in fleet.servers.values())


async def test_servers_added_and_removed_while_running(pair):
    a, b = pair
    a.gate = asyncio.Event()
    async with _fleet([a]) as fleet:
        slow = asyncio.create_task(_gen(fleet))
        await until(lambda: a.in_flight == 1)
        fleet.set_urls([b.url])  # a drains, b joins
        assert fleet.servers[a.url].draining
        await asyncio.gather(*(_gen(fleet) for _ in range(3)))
        assert b.served == 3
        a.gate.set()
        assert (await slow).tokens == [7, 7]  # the in-flight request on the removed server finished
        assert list(fleet.servers) == [b.url]
        fleet.set_urls([a.url, b.url])
        await asyncio.gather(*(_gen(fleet) for _ in range(4)))
        assert a.served >= 1


async def test_server_outside_the_staleness_bound_gets_no_requests(pair):
    a, b = pair
    a.version, b.version = "3", "10"
    async with _fleet(pair, max_staleness=4, learner_version=lambda: 10) as fleet:
        await fleet.check_health()
        assert not fleet.usable(fleet.servers[a.url]) and fleet.usable(fleet.servers[b.url])
        await asyncio.gather(*(_gen(fleet) for _ in range(5)))
        assert a.served == 0 and b.served == 5
        a.version = "9"  # re-synced by the learner
        await fleet.check_health()
        await asyncio.gather(*(_gen(fleet) for _ in range(6)))
        assert a.served >= 1


async def test_waits_for_a_server_to_come_back(pair):
    a, b = pair
    await b.stop()
    a.fail_status = 503
    metrics = ActorMetrics()
    async with _fleet([a], health_interval_s=0.05, metrics=metrics) as fleet:
        pending = asyncio.create_task(_gen(fleet))  # retries a, which fails, until it serves again
        await until(lambda: (metrics.registry.get_sample_value("turnstream_actor_server_failures_total",
                                                                {"server": a.url}) or 0) >= 2, "a failing twice")
        assert not pending.done()
        a.fail_status = 0
        assert (await pending).tokens == [7, 7]


async def test_dropped_keep_alive_connection_is_retried_on_the_same_server(pair):
    a, b = pair
    await b.stop()
    a.drop_connections = 1
    metrics = ActorMetrics()
    failures = 'turnstream_actor_server_failures_total'
    async with _fleet([a], metrics=metrics) as fleet:
        assert (await _gen(fleet)).tokens == [7, 7]
        assert fleet.servers[a.url].healthy and a.served == 1
        assert metrics.registry.get_sample_value(failures, {"server": a.url}) is None
        a.drop_connections = 2  # twice in a row is the server's fault: down, then probed again after a pause
        assert (await _gen(fleet)).tokens == [7, 7]
        assert metrics.registry.get_sample_value(failures, {"server": a.url}) == 1 and a.served == 2
        assert fleet.servers[a.url].healthy  # it answered the probe
        a.drop_connections = 10**6  # it never answers: the request fails at its deadline, naming the cause
    async with _fleet([a], timeout_s=0.5) as fleet:
        with pytest.raises(InferenceError, match="Server disconnected"):
            await _gen(fleet)
        assert not fleet.servers[a.url].healthy


async def test_requests_name_the_lora_adapter_and_a_server_without_it_is_skipped(pair):
    """learner.lora: actors ask for the served adapter; a server that does not hold it (not yet pushed, or
    restarted since) answers 404, which fails over like a server failure instead of failing the turn."""
    a, b = pair
    b.adapters = {"policy-lora"}
    async with _fleet(pair, model="policy-lora") as fleet:
        gens = [await _gen(fleet) for _ in range(4)]
        assert all(g.tokens == [7, 7] for g in gens) and b.served == 4 and a.served == 0
        assert not fleet.servers[a.url].healthy and set(a.models + b.models) == {"policy-lora"}
    async with _fleet([a]) as fleet:  # without LoRA the request names no model
        await _gen(fleet)
        assert a.models[-1] is None


async def test_server_without_the_adapter_stays_down_until_it_is_loaded(pair):
    """A server answering /health but not holding the adapter (restarted since the last push) is not revived by
    the health check, which would send it requests that 404 again at every interval; it comes back once the
    learner's re-sync loads the adapter (listed in /v1/models)."""
    a, b = pair
    b.adapters = {"policy-lora"}
    async with _fleet(pair, model="policy-lora") as fleet:
        await _gen(fleet)
        await _gen(fleet)
        assert not fleet.servers[a.url].healthy
        for _ in range(2):
            await fleet.check_health()
            assert not fleet.servers[a.url].healthy and "not loaded" in fleet.servers[a.url].last_error
        await asyncio.gather(*(_gen(fleet) for _ in range(4)))
        assert a.models.count("policy-lora") == 1  # only the first request, before it was marked down
        a.adapters = {"policy-lora"}  # the re-sync
        await fleet.check_health()
        assert fleet.servers[a.url].healthy
        await asyncio.gather(*(_gen(fleet) for _ in range(4)))
        assert a.served >= 1
        b.adapters = set()  # b restarts: the next check takes it out before any request fails on it
        await fleet.check_health()
        assert not fleet.servers[b.url].healthy and fleet.servers[a.url].healthy


async def test_an_actor_waits_for_its_adapter_before_it_plays(pair):
    """learner.lora: the adapter exists only after the learner's first push; until a server lists it, the actor
    waits instead of starting episodes whose requests would fail until their time limit. Without an adapter
    there is nothing to wait for."""
    a, b = pair
    async with _fleet(pair, model="policy-lora") as fleet:
        waiting = asyncio.create_task(fleet.until_serving(poll_s=0.05))
        also = asyncio.create_task(fleet.until_serving(poll_s=0.05))  # the evaluator: the same one wait
        await asyncio.sleep(0.3)
        assert not waiting.done() and not any(s.healthy for s in fleet.servers.values())
        b.adapters = {"policy-lora"}  # the learner's first push
        await asyncio.wait_for(asyncio.gather(waiting, also), 5.0)
        assert fleet.servers[b.url].healthy and not fleet.servers[a.url].healthy
        assert a.served == b.served == 0  # no request was sent while it waited
    async with _fleet([a]) as fleet:
        await asyncio.wait_for(fleet.until_serving(), 1.0)
