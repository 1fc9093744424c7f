"""Token ids as uint32 on the wire, negotiated: a real BufferLink sends a large chunk's ids unsigned only to a
buffer whose credit grant says it takes them, and as int32 to one that predates the field."""
from __future__ import annotations

import asyncio

import msgpack
import numpy as np
import zmq
import zmq.asyncio

from turnstream.actors.link import PACK_BELOW_BYTES, BufferLink
from turnstream.actors.metrics import ActorMetrics
from turnstream.protocol.codec import encode
from turnstream.protocol.messages import UNSIGNED_TOKENS, CreditGrant
from tests.helpers import chunk, in_process_buffer, link_to_router, stop_in_process_buffer

LARGE_OBS = np.arange(PACK_BELOW_BYTES // 4 + 100, dtype=np.int32) % 1000  # sent alone, not packed


async def test_a_buffer_that_takes_unsigned_ids_gets_large_chunks_so_and_small_ones_as_int32():
    server, store, metrics = in_process_buffer()
    ctx = zmq.asyncio.Context()
    link = BufferLink(ctx, f"tcp://127.0.0.1:{server.ingest_port}", actor_id="actor-t", epoch=1, slots=4,
                      max_unacked=8, resend_after_s=60.0, metrics=ActorMetrics(), max_message_bytes=1 << 20,
                      heartbeat_s=0.05)
    tasks = [asyncio.create_task(server.run()), asyncio.create_task(link.run())]
    try:
        await asyncio.wait_for(link.acquire_credit(), 10)  # the first grant has come, with its capabilities
        assert link.unsigned_tokens
        await link.send(chunk("large", 0, seq=0, obs=LARGE_OBS, gen=(7, 8), done=True))
        await link.send(chunk("small", 0, seq=0, obs=(1, 2, 3), gen=(7,), done=True))
        async with link._changed:
            await asyncio.wait_for(link._changed.wait_for(lambda: not link.unacked), 10)
        assert link.m.acks.labels("ok")._value.get() == 2
        large, small = store.ready["large"].turns[0], store.ready["small"].turns[0]
        assert all(getattr(large, name).dtype == np.uint32 for name in UNSIGNED_TOKENS)
        np.testing.assert_array_equal(large.obs_tokens, LARGE_OBS)
        assert small.obs_tokens.dtype == np.int32  # small chunks stay int32: checking their sign costs next to nothing
        assert metrics.registry.get_sample_value("turnstream_buffer_chunks_total", {"outcome": "ok"}) == 2
    finally:
        await stop_in_process_buffer(tasks, server, ctx)


async def test_a_buffer_that_predates_the_field_gets_int32():
    ctx = zmq.asyncio.Context()
    router, link, _metrics = link_to_router(ctx, "actor-old", slots=1, heartbeat_s=0.05)
    task = asyncio.create_task(link.run())
    try:
        identity, *_ = await asyncio.wait_for(router.recv_multipart(), 10)  # the link's credit request
        header, *frames = encode(CreditGrant(credits=1, server_id="old"))
        fields = msgpack.unpackb(header)
        del fields["f"]["unsigned_tokens"]  # what a buffer from before the field sends
        await router.send_multipart([identity, msgpack.packb(fields), *frames])
        await asyncio.wait_for(link.acquire_credit(), 10)
        assert not link.unsigned_tokens
        await link.send(chunk("large", 0, seq=0, obs=LARGE_OBS, gen=(7, 8), done=True))
        while True:
            _, header, *_ = await asyncio.wait_for(router.recv_multipart(), 10)
            sent = msgpack.unpackb(header)
            if sent["t"] == "turn_chunk":
                break
        assert {name: sent["a"][name][0] for name in UNSIGNED_TOKENS} == dict.fromkeys(UNSIGNED_TOKENS, "<i4")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        ctx.destroy(linger=0)
