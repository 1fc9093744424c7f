"""Message bundles, negotiated: a real BufferLink joins the messages it sends together into one multipart message
only for a buffer whose credit grant says it takes them; a real buffer process acks, journals and keeps every
chunk of a bundle as if each had come alone, through a kill -9, and rejects a bad one without its neighbours."""
from __future__ import annotations

import asyncio

import msgpack
import numpy as np
import pytest
import zmq
import zmq.asyncio

from turnstream.actors.link import MAX_BUNDLE_CHUNKS, PACK_BELOW_BYTES, BufferLink
from turnstream.actors.metrics import ActorMetrics
from turnstream.protocol.codec import decode, decode_bundle, encode
from turnstream.protocol.messages import Batch, BatchRequest, CreditGrant, TurnChunk
from tests.helpers import BufferProcess, acks_in, chunk, link_to_router, until

LARGE = PACK_BELOW_BYTES // 4 + 100  # token ids in a chunk sent as a message of its own, not packed


def large_chunk(i: int, actor_id: str) -> TurnChunk:
    obs = (np.arange(LARGE, dtype=np.int32) + i) % 1000
    return chunk(f"e{i}", 0, seq=0, actor_id=actor_id, epoch=3, obs=obs, gen=(7, i), done=True)


async def _grant_and_collect(router, link, *, bundles: bool | None, chunks: int) -> list[list[str]]:
    """Answer the link's credit request with a grant (without the field if bundles is None, as a buffer from
    before it), let it send `chunks` large chunks queued together, and return the episode ids of each
    multipart message that reached the router."""
    identity, *_ = await asyncio.wait_for(router.recv_multipart(), 10)
    header, *frames = encode(CreditGrant(credits=1, server_id="s", message_bundles=bool(bundles)))
    fields = msgpack.unpackb(header)
    if bundles is None:
        del fields["f"]["message_bundles"]
    await router.send_multipart([identity, msgpack.packb(fields), *frames])
    await asyncio.wait_for(link.acquire_credit(), 10)
    assert link.message_bundles is bool(bundles)
    for i in range(chunks):  # no await yields in between: all of them queue before the sender runs
        await link.send(large_chunk(i, link.actor_id))
    messages: list[list[str]] = []
    while sum(map(len, messages)) < chunks:
        _, *frames = await asyncio.wait_for(router.recv_multipart(), 10)
        ids = [msg.episode_id for msg, _ in decode_bundle(frames, 1 << 30) if isinstance(msg, TurnChunk)]
        if ids:
            messages.append(ids)
    return messages


@pytest.mark.parametrize("bundles", [True, False, None])
async def test_a_link_bundles_what_queued_together_only_for_a_buffer_that_takes_bundles(bundles):
    ctx = zmq.asyncio.Context()
    router, link, _metrics = link_to_router(ctx, "actor-b", slots=1, heartbeat_s=60.0)
    task = asyncio.create_task(link.run())
    try:
        messages = await _grant_and_collect(router, link, bundles=bundles, chunks=MAX_BUNDLE_CHUNKS + 2)
        ids = [f"e{i}" for i in range(MAX_BUNDLE_CHUNKS + 2)]
        if bundles:  # in order, at most MAX_BUNDLE_CHUNKS to a bundle
            assert messages == [ids[:MAX_BUNDLE_CHUNKS], ids[MAX_BUNDLE_CHUNKS:]]
        else:
            assert messages == [[i] for i in ids]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        ctx.destroy(linger=0)


async def test_a_buffer_process_acks_journals_and_keeps_every_chunk_of_a_bundle(tmp_path):
    b = BufferProcess(tmp_path, wal_fsync="always", batch_episodes=6, eta=10, max_staleness=10)
    b.start()
    ctx = zmq.asyncio.Context()
    link = BufferLink(ctx, f"tcp://127.0.0.1:{b.cfg.network.buffer_ingest_port}", actor_id="actor-w", epoch=3,
                      slots=8, max_unacked=64, resend_after_s=60.0, metrics=ActorMetrics(),
                      max_message_bytes=1 << 24, heartbeat_s=0.1)
    sent: list[list] = []
    send_all = link.io.send_all

    async def recording_send_all(messages):
        sent.extend(messages)
        await send_all(messages)

    link.io.send_all = recording_send_all
    task = asyncio.create_task(link.run())
    try:
        await until(lambda: link.message_bundles, "the buffer's grant", 20.0)
        for i in range(6):
            await link.send(large_chunk(i, "actor-w"))
        await until(lambda: not link.unacked, "every chunk acked", 20.0)
        assert link.m.acks.labels("ok")._value.get() == 6
        bundled = [m for m in sent if len(list(decode_bundle(m, 1 << 30))) > 1]
        assert bundled, "no bundle was sent"
        assert await asyncio.to_thread(b.metric, 'turnstream_buffer_chunks_total{outcome="ok"}') == 6

        b.kill9()
        await asyncio.to_thread(b.start)
        learner = ctx.socket(zmq.DEALER)
        learner.setsockopt(zmq.LINGER, 0)
        learner.connect(f"tcp://127.0.0.1:{b.cfg.network.buffer_serve_port}")
        await learner.send_multipart(encode(BatchRequest(request_id=1, learner_version=0, max_episodes=6)))
        batch = decode(await asyncio.wait_for(learner.recv_multipart(), 15))
        assert isinstance(batch, Batch) and sorted(batch.episode_ids) == [f"e{i}" for i in range(6)]
        for k, episode in enumerate(batch.episode_ids):  # each chunk's own tokens, once
            i = int(episode[1:])
            tokens = batch.tokens[batch.episode_offsets[k]:batch.episode_offsets[k + 1]]
            np.testing.assert_array_equal(tokens, np.concatenate([(np.arange(LARGE) + i) % 1000, [7, i]]))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        ctx.destroy(linger=0)
        b.procs.stop_all()


def test_a_bad_message_in_a_bundle_is_rejected_and_counted_and_its_neighbours_are_acked(tmp_path):
    b = BufferProcess(tmp_path, wal=False)
    b.start()
    ctx = zmq.Context()
    try:
        actor = ctx.socket(zmq.DEALER)
        actor.setsockopt(zmq.LINGER, 0)
        actor.connect(f"tcp://127.0.0.1:{b.cfg.network.buffer_ingest_port}")
        good = [encode(chunk(f"g{seq}", 0, seq=seq, done=True)) for seq in (0, 2)]
        header, *arrays = encode(chunk("bad", 0, seq=1, done=True))
        fields = msgpack.unpackb(header)
        fields["a"]["gen_logprobs"][0] = "<f8"  # delimitable, but not a valid chunk
        actor.send_multipart([*good[0], msgpack.packb(fields), *arrays, *good[1]])
        acked = []
        while len(acked) < 2:
            assert actor.poll(15_000), "no ack"
            acked += acks_in(decode(actor.recv_multipart()))
        assert sorted(acked) == [(0, "ok"), (2, "ok")]
        assert b.metric('turnstream_buffer_rejected_total{reason="bad_dtype"}') == 1
        assert b.metric('turnstream_buffer_chunks_total{outcome="ok"}') == 2
        actor.send_multipart(encode(chunk("g3", 0, seq=3, done=True)))  # and the buffer serves on
        assert actor.poll(15_000) and acks_in(decode(actor.recv_multipart())) == [(3, "ok")]
    finally:
        ctx.destroy(linger=0)
        b.procs.stop_all()
