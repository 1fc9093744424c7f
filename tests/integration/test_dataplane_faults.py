"""Duplicate / reorder / drop injection between a real BufferLink and a real BufferServer (real sockets).

A seeded proxy sits on the TCP path and, in both directions, drops, duplicates and reorders messages
(chunks, acks, credit requests and grants alike). At-least-once sending plus idempotent ingest must still
give exactly-once ingestion: every chunk in the store once, every episode served once.
"""
from __future__ import annotations

import asyncio
import random

import pytest
import zmq
import zmq.asyncio

from turnstream.actors.link import BufferLink
from turnstream.actors.metrics import ActorMetrics
from tests.helpers import chunk, in_process_buffer, stop_in_process_buffer, until


class FlakyProxy:
    """ROUTER (actors connect here) <-> DEALER (to the buffer); one actor, seeded faults."""

    def __init__(self, ctx, upstream: str, rng: random.Random, p_drop=0.15, p_dup=0.15, p_reorder=0.15):
        self.front = ctx.socket(zmq.ROUTER)
        self.front.setsockopt(zmq.LINGER, 0)
        self.port = self.front.bind_to_random_port("tcp://127.0.0.1")
        self.back = ctx.socket(zmq.DEALER)
        self.back.setsockopt(zmq.LINGER, 0)
        self.back.connect(upstream)
        self.rng, self.p = rng, (p_drop, p_dup, p_reorder)
        self.actor_identity = None
        self.faults = {"drop": 0, "dup": 0, "reorder": 0}

    async def run(self):
        await asyncio.gather(self._pump(self.front, self._to_back), self._pump(self.back, self._to_front))

    async def _to_back(self, msg):
        self.actor_identity = msg[0]
        await self.back.send_multipart(msg[1:])

    async def _to_front(self, msg):
        await self.front.send_multipart([self.actor_identity, *msg])

    async def _pump(self, sock, forward):
        held = None
        while True:
            msg = await sock.recv_multipart()
            r = self.rng.random()
            p_drop, p_dup, p_reorder = self.p
            if r < p_drop:
                self.faults["drop"] += 1
                continue
            if r < p_drop + p_reorder and held is None:
                held = msg  # goes out after the next message
                self.faults["reorder"] += 1
                continue
            await forward(msg)
            if r > 1 - p_dup:
                self.faults["dup"] += 1
                await forward(msg)
            if held is not None:
                await forward(held)
                held = None


@pytest.mark.parametrize("ack_delay_s", [0.0, 0.001], ids=["acks-at-once", "delayed-acks"])
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_exactly_once_ingestion_through_drops_duplicates_and_reordering(seed, ack_delay_s):
    server, store, metrics = in_process_buffer(housekeeping_s=0.1, ack_delay_s=ack_delay_s)
    ctx = zmq.asyncio.Context()
    proxy = FlakyProxy(ctx, f"tcp://127.0.0.1:{server.ingest_port}", random.Random(seed))
    link = BufferLink(ctx, f"tcp://127.0.0.1:{proxy.port}", actor_id="actor-f", epoch=1, slots=20,
                      max_unacked=8, resend_after_s=0.15, metrics=ActorMetrics(), max_message_bytes=1 << 20,
                      heartbeat_s=0.05)
    tasks = [asyncio.create_task(t) for t in (server.run(), proxy.run(), link.run())]
    episodes, turns = 20, 3
    try:
        for e in range(episodes):
            for t in range(turns):
                await link.send(chunk(f"e{e}", t, seq=0, actor_id="actor-f", epoch=1, done=t == turns - 1,
                                      obs=(1 + t,), gen=(100 + e,)))
        await until(lambda: not link.unacked, "every chunk acked through the faulty proxy", 30.0)
        sample = metrics.registry.get_sample_value
        assert sample("turnstream_buffer_chunks_total", {"outcome": "ok"}) == episodes * turns
        assert sum(proxy.faults.values()) > 0
        got = store.take_batch(0, episodes)
        assert got is not None
        served = got[0]
        assert sorted(ep.episode_id for ep in served) == sorted(f"e{e}" for e in range(episodes))
        for ep in served:
            assert sorted(ep.turns) == list(range(turns))
            assert {int(c.gen_tokens[0]) for c in ep.turns.values()} == {100 + int(ep.episode_id[1:])}
        assert store.take_batch(0, 1) is None and not store.in_progress
    finally:
        await stop_in_process_buffer(tasks, server, ctx)
