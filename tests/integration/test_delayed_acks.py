"""Delayed acks (buffer.ack_delay_ms): a real BufferServer on real sockets, an async DEALER as the actor.

Acks wait for more chunks up to the delay, so one ack message answers several chunks; 16 waiting chunks
and a credit request are answered without waiting it out.
"""
from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio

from turnstream.buffer.acks import ACK_AFTER_CHUNKS
from turnstream.protocol.codec import decode, encode
from turnstream.protocol.messages import CreditGrant, CreditRequest
from tests.helpers import acks_in, chunk, chunk_frames, in_process_buffer, stop_in_process_buffer


async def _stack(ack_delay_s: float):
    server, store, _metrics = in_process_buffer(ack_delay_s=ack_delay_s)
    ctx = zmq.asyncio.Context()
    actor = ctx.socket(zmq.DEALER)
    actor.setsockopt(zmq.LINGER, 0)
    actor.connect(f"tcp://127.0.0.1:{server.ingest_port}")
    return server, store, ctx, actor, asyncio.create_task(server.run())


async def _replies(actor, until_acks: int, until_grant: bool = False, timeout_s: float = 10.0) -> list:
    replies = []
    while sum(len(acks_in(r)) for r in replies) < until_acks or \
            until_grant and not any(isinstance(r, CreditGrant) for r in replies):
        assert await actor.poll(timeout_s * 1000), f"no reply; so far {replies}"
        replies.append(decode(await actor.recv_multipart()))
    return replies


async def test_chunks_within_the_delay_share_one_ack_message():
    server, store, ctx, actor, task = await _stack(ack_delay_s=3.0)  # the three are sent within microseconds
    try:
        for seq in range(3):
            await actor.send_multipart(chunk_frames(chunk(f"e{seq}", 0, seq=seq, done=True)))
        replies = await _replies(actor, until_acks=3)
        assert [acks_in(r) for r in replies] == [[(0, "ok"), (1, "ok"), (2, "ok")]]
        assert len(store.ready) == 3
    finally:
        await stop_in_process_buffer([task], server, ctx)


async def test_a_full_group_is_acked_without_waiting_out_the_delay():
    server, _store, ctx, actor, task = await _stack(ack_delay_s=600.0)  # far beyond the test's time-out
    try:
        for seq in range(ACK_AFTER_CHUNKS):
            await actor.send_multipart(chunk_frames(chunk(f"e{seq}", 0, seq=seq, done=True)))
        replies = await _replies(actor, until_acks=ACK_AFTER_CHUNKS)
        assert [seq for r in replies for seq, _ in acks_in(r)] == list(range(ACK_AFTER_CHUNKS))
    finally:
        await stop_in_process_buffer([task], server, ctx)


async def test_a_credit_request_is_answered_at_once_with_the_waiting_acks():
    server, _store, ctx, actor, task = await _stack(ack_delay_s=600.0)
    try:
        await actor.send_multipart(chunk_frames(chunk("e0", 0, seq=0, done=True)))
        await actor.send_multipart(encode(CreditRequest("actor-t", 1, slots=2)))
        replies = await _replies(actor, until_acks=1, until_grant=True)
        assert [acks_in(r) for r in replies if acks_in(r)] == [[(0, "ok")]]
    finally:
        await stop_in_process_buffer([task], server, ctx)


async def test_no_delay_acks_every_drained_group_at_once():
    server, _store, ctx, actor, task = await _stack(ack_delay_s=0.0)
    try:
        for seq in range(3):
            await actor.send_multipart(chunk_frames(chunk(f"e{seq}", 0, seq=seq, done=True)))
            assert acks_in((await _replies(actor, until_acks=1))[0]) == [(seq, "ok")]
    finally:
        await stop_in_process_buffer([task], server, ctx)
