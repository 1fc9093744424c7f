"""The learner's batch client over a real DEALER, against a ROUTER that plays the buffer's serve socket."""
from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio

from turnstream.buffer.store.episodes import flatten
from turnstream.learner.batch_client import BatchClient
from turnstream.protocol.codec import decode, encode
from turnstream.protocol.messages import BatchRequest


async def test_an_answer_sent_twice_is_skipped_without_re_asking():
    """The buffer sends a batch again when a re-ask crosses its answer; the second copy reaches the client
    during its next request and must neither be returned nor make the client ask that request again."""
    ctx = zmq.asyncio.Context()
    try:
        buffer = ctx.socket(zmq.ROUTER)
        buffer.setsockopt(zmq.LINGER, 0)
        port = buffer.bind_to_random_port("tcp://127.0.0.1")
        client = BatchClient(ctx, f"tcp://127.0.0.1:{port}", 1 << 20, None)

        async def play_buffer():
            identity, *frames = await buffer.recv_multipart()
            assert identity.startswith(b"learner-")  # the fixed routing id the buffer keys its last answer on
            first = decode(frames)
            assert isinstance(first, BatchRequest) and first.request_id == 1
            for _ in range(2):
                await buffer.send_multipart([identity, *encode(flatten([], 1, 0, 0))])
            identity_again, *frames = await buffer.recv_multipart()
            assert identity_again == identity and decode(frames).request_id == 2
            # a re-ask of request 2 would arrive well within this time if the stray copy had triggered one
            assert not await buffer.poll(1500)
            await buffer.send_multipart([identity, *encode(flatten([], 2, 0, 0))])

        fake = asyncio.create_task(play_buffer())
        assert (await asyncio.wait_for(client.get(0, 1, retry_s=10), 10)).request_id == 1
        assert (await asyncio.wait_for(client.get(0, 1, retry_s=10), 10)).request_id == 2
        await asyncio.wait_for(fake, 10)
    finally:
        ctx.destroy(linger=0)
