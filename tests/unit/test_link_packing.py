"""BufferLink packs small chunks that queue up into one `turn_chunks` message, sends large ones in one of
their own, and takes an `acks` message as the acks of every chunk it names (real sockets on 127.0.0.1)."""
from __future__ import annotations

import asyncio

import numpy as np
import zmq
import zmq.asyncio

from turnstream.actors.link import MAX_PACKED_CHUNKS, PACK_BELOW_BYTES, packing_groups
from turnstream.protocol.chunk_batch import unpack
from turnstream.protocol.codec import decode, encode
from turnstream.protocol.messages import AckBatch, TurnChunkBatch
from tests.helpers import chunk, link_to_router


async def test_small_chunks_travel_packed_large_ones_alone_and_one_acks_message_clears_them():
    ctx = zmq.asyncio.Context()
    router, link, metrics = link_to_router(ctx, "actor-p", slots=0, heartbeat_s=60.0)
    task = asyncio.create_task(link.run())
    try:
        big_obs = np.arange(PACK_BELOW_BYTES // 4 + 10, dtype=np.int32)
        for i in range(20):  # no await yields in between: all of them queue before the sender runs
            await link.send(chunk(f"e{i}", 0, seq=0, actor_id="actor-p", done=True))
        await link.send(chunk("big", 0, seq=0, actor_id="actor-p", done=True, obs=big_obs))
        received: dict[int, str] = {}
        identity, messages = None, 0
        while len(received) < 21:
            assert await router.poll(10_000), "the link sent nothing"
            identity, *frames = await router.recv_multipart()
            msg = decode(frames)
            if isinstance(msg, TurnChunkBatch):
                received.update({c.seq: c.episode_id for c in unpack(msg)})
                messages += 1
        assert received == {**{i: f"e{i}" for i in range(20)}, 20: "big"}
        assert messages == 2  # the 20 small ones in one message, the large one in another
        assert metrics.chunks_sent._value.get() == 21
        assert len(link.unacked) == 21

        statuses = np.zeros(21, np.uint8)
        statuses[3] = AckBatch.STATUSES.index("duplicate")
        await router.send_multipart([identity, *encode(AckBatch(seq=np.arange(21, dtype=np.int64),
                                                                  status=statuses))])
        for _ in range(200):
            if not link.unacked:
                break
            await asyncio.sleep(0.01)
        assert not link.unacked
        assert metrics.acks.labels("ok")._value.get() == 20
        assert metrics.acks.labels("duplicate")._value.get() == 1
    finally:
        task.cancel()
        ctx.destroy(linger=0)


def test_packing_groups_keep_large_chunks_alone_and_cap_the_small_ones():
    small = [chunk(f"s{i}", 0, seq=i) for i in range(MAX_PACKED_CHUNKS + 3)]
    large = chunk("big", 0, seq=0, obs=np.zeros(PACK_BELOW_BYTES // 4, np.int32))
    groups = packing_groups([*small[:2], large, *small[2:]])
    assert [[c.episode_id for c in g] for g in groups] == [
        [c.episode_id for c in small[:MAX_PACKED_CHUNKS]], ["big"], [c.episode_id for c in small[MAX_PACKED_CHUNKS:]]]
