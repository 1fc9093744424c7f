"""A learner stopped while its batch request is in flight takes the answer instead of dropping it: the buffer
counts a batch consumed once it sends it, so a dropped answer would be a batch nobody ever trains (the fault
suite's graceful stop and resume saw exactly that). A real BufferServer over real sockets."""
from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import zmq.asyncio

from turnstream.learner.batch_client import BatchClient
from turnstream.learner.serve import POLL_S, STOP_GRACE_S, next_batch
from turnstream.protocol.chunk_batch import pack
from tests.helpers import chunk, in_process_buffer

CFG = SimpleNamespace(buffer=SimpleNamespace(batch_episodes=2), learner=SimpleNamespace(batch_max_tokens=0))


async def _with_buffer(test):
    server, store, _metrics = in_process_buffer(batch_episodes=2, eta=9)
    ctx = zmq.asyncio.Context()
    task = asyncio.create_task(server.run())
    try:
        await test(store, BatchClient(ctx, f"tcp://127.0.0.1:{server.serve_port}", 1 << 20, None))
    finally:
        task.cancel()
        server.close()
        ctx.destroy(linger=0)


async def test_a_stop_during_the_request_still_returns_the_batch_it_was_served():
    async def test(store, client):
        for e in range(2):
            assert store.ingest_message(b"a", pack([chunk(f"e{e}", 0, seq=e, done=True)])) == [(e, "ok", "")]
        stop = asyncio.Event()
        stop.set()  # the signal came as the request went out
        batch = await asyncio.wait_for(next_batch(client, CFG, 0, stop), 30)
        assert batch is not None and batch.episode_ids == ["e0", "e1"]
    await _with_buffer(test)


async def test_a_stop_with_nothing_to_serve_ends_the_wait_within_the_poll():
    async def test(store, client):
        stop = asyncio.Event()
        fetching = asyncio.create_task(next_batch(client, CFG, 0, stop))
        await asyncio.sleep(0.5)
        assert not fetching.done()  # no data: the learner waits
        stop.set()
        started = time.monotonic()
        assert await asyncio.wait_for(fetching, 30) is None
        assert time.monotonic() - started <= POLL_S + STOP_GRACE_S
    await _with_buffer(test)
