"""Generation busy time: the union of request intervals per server, exported as a Prometheus counter."""
from __future__ import annotations

import asyncio

from turnstream.actors.inference.fleet import InferenceFleet, Server
from turnstream.actors.metrics import ActorMetrics
from tests.helpers import until
from tests.unit.fake_vllm import FakeVllm


def test_overlapping_requests_count_once():
    s = Server("http://x")
    s.begin(0.0)
    s.begin(1.0)  # overlaps the first
    s.end(2.0)
    s.begin(2.5)  # starts while one is still outstanding
    s.end(3.0)
    s.end(4.0)  # busy [0, 4]: 4 s, although the three requests last 9 - 3.5 = 5.5 s in total
    assert s.busy_s == 4.0 and s.outstanding == 0
    s.accrue(9.0)  # idle time is never counted
    s.begin(10.0)
    assert s.accrue(10.5) == 0.5  # mid-stretch accrual brings the counter up to now...
    s.end(11.0)
    assert s.busy_s == 5.0  # ...without counting anything twice


def test_disjoint_and_nested_intervals():
    s = Server("http://x")
    for start, end in ((0.0, 1.0), (5.0, 5.25)):
        s.begin(start)
        s.end(end)
    s.begin(6.0)
    s.begin(6.5)
    s.end(7.0)  # nested inside [6, 8]
    s.end(8.0)
    assert s.busy_s == 1.0 + 0.25 + 2.0


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_fleet_counter_is_the_union_of_overlapping_requests():
    server = await FakeVllm("a").start()
    metrics, clock = ActorMetrics(), _Clock()

    def busy() -> float:
        return metrics.registry.get_sample_value("turnstream_actor_server_busy_seconds_total",
                                                 {"server": server.url}) or 0.0

    try:
        async with InferenceFleet([server.url], timeout_s=5.0, health_interval_s=0, metrics=metrics,
                                  clock=clock) as fleet:
            def gen():
                return asyncio.create_task(fleet.generate([1, 2], max_tokens=1, temperature=1.0))

            server.gate = asyncio.Event()
            first = gen()  # t = 100
            await until(lambda: server.in_flight == 1)
            clock.now = 101.0
            second = gen()
            await until(lambda: server.in_flight == 2)
            clock.now = 103.0
            server.gate.set()  # both finish at t = 103: busy 3 s, not 3 + 2
            await asyncio.gather(first, second)
            assert busy() == 3.0

            clock.now = 110.0  # idle 103..110
            server.gate = asyncio.Event()
            third = gen()
            await until(lambda: server.in_flight == 1)
            clock.now = 114.0
            await fleet.check_health()  # a long request shows before it ends
            assert busy() == 3.0 + 4.0
            clock.now = 115.0
            server.gate.set()
            await third
            assert busy() == 3.0 + 5.0
    finally:
        await server.stop()
