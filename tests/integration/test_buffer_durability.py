"""kill -9 of the real buffer process, restart, and the promises that must survive it; bounded memory."""
from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
import zmq
import zmq.asyncio

from turnstream.actors.link import BufferLink
from turnstream.actors.metrics import ActorMetrics
from turnstream.protocol.codec import decode, encode
from turnstream.protocol.messages import AckBatch, Batch, BatchRequest, CreditGrant, CreditRequest
from tests.helpers import BufferProcess, acks_in, chunk, chunk_frames, scrape, until


@pytest.fixture
def buffer(tmp_path):
    procs = []

    def make(**overrides):
        b = BufferProcess(tmp_path, **overrides)
        procs.append(b)
        return b

    yield make
    for b in procs:
        b.procs.stop_all()


def _dealer(ctx, port):
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://127.0.0.1:{port}")
    return sock


def _recv(sock, kind=None, timeout_s=15.0):
    while True:
        assert sock.poll(timeout_s * 1000), "no reply"
        msg = decode(sock.recv_multipart())
        if kind is None or isinstance(msg, kind):
            return msg


def test_kill9_restart_keeps_every_acked_chunk_and_serves_nothing_twice(buffer):
    b = buffer(wal_fsync="always")
    b.start()
    ctx = zmq.Context()
    try:
        actor = _dealer(ctx, b.cfg.network.buffer_ingest_port)
        actor.send_multipart(encode(CreditRequest("actor-t", 1, slots=8)))
        assert _recv(actor, CreditGrant).credits > 0
        sent, seq = [], 0
        for ep in ["e0", "e1", "e2", "e3", "e4", "e5", "open"]:
            for turn in range(2 if ep != "open" else 1):
                c = chunk(ep, turn, seq=seq, done=(turn == 1), obs=(10 + turn,), gen=(20 + seq,))
                actor.send_multipart(chunk_frames(c))
                assert acks_in(_recv(actor, AckBatch)) == [(seq, "ok")]
                sent.append(c)
                seq += 1
        learner = _dealer(ctx, b.cfg.network.buffer_serve_port)
        learner.send_multipart(encode(BatchRequest(request_id=1, learner_version=0, max_episodes=2)))
        assert _recv(learner, Batch).episode_ids == ["e0", "e1"]

        b.kill9()
        b.start()

        for c in sent:  # an actor that never saw its acks resends everything: all duplicates now
            actor.send_multipart(chunk_frames(c))
            assert acks_in(_recv(actor, AckBatch)) == [(c.seq, "duplicate")]
        assert b.metric('turnstream_buffer_chunks_total{outcome="duplicate"}') == len(sent)
        assert b.metric('turnstream_buffer_chunks_total{outcome="ok"}') == 0
        learner.send_multipart(encode(BatchRequest(request_id=2, learner_version=0, max_episodes=4)))
        batch = _recv(learner, Batch)
        assert batch.episode_ids == ["e2", "e3", "e4", "e5"]
        tokens = batch.tokens[batch.episode_offsets[0]:batch.episode_offsets[1]].tolist()
        assert tokens == [10, 24, 11, 25]  # the very tokens acked before the crash
        learner.send_multipart(encode(BatchRequest(request_id=2, learner_version=0, max_episodes=4)))
        again = _recv(learner, Batch)  # a re-ask of the answered request gets the same batch, not a second one
        assert again.request_id == 2 and again.episode_ids == batch.episode_ids
        learner.send_multipart(encode(BatchRequest(request_id=3, learner_version=0, max_episodes=1,
                                                   timeout_s=0.3)))
        assert _recv(learner, Batch).status == "timeout"  # e0/e1 are not served again; "open" is not done

        actor.send_multipart(chunk_frames(chunk("open", 1, seq=seq, done=True, obs=(11,), gen=(99,))))
        assert acks_in(_recv(actor, AckBatch)) == [(seq, "ok")]  # the half-finished episode survived and can complete
        b.kill9()  # once more, after a consumption, to check the compacted log too
        b.start()
        learner.send_multipart(encode(BatchRequest(request_id=4, learner_version=0, max_episodes=1)))
        assert _recv(learner, Batch).episode_ids == ["open"]
    finally:
        ctx.destroy(linger=0)


async def test_actor_link_resends_its_window_to_a_restarted_buffer(buffer):
    b = buffer(wal_fsync="interval", actor_timeout_s=30.0)
    b.start()
    ctx = zmq.asyncio.Context()
    link = BufferLink(ctx, f"tcp://127.0.0.1:{b.cfg.network.buffer_ingest_port}", actor_id="actor-r", epoch=7,
                      slots=4, max_unacked=64, resend_after_s=30.0, metrics=ActorMetrics(),
                      max_message_bytes=1 << 20, heartbeat_s=0.1)
    task = asyncio.create_task(link.run())
    try:
        for i in range(3):
            await link.send(chunk(f"a{i}", 0, seq=0, actor_id="actor-r", epoch=7, done=True))
        await until(lambda: not link.unacked and link.server_id, "every chunk acked", 20.0)
        first_server = link.server_id
        b.kill9()
        for i in range(3):  # sent while the buffer is down: no ack can come
            await link.send(chunk(f"b{i}", 0, seq=0, actor_id="actor-r", epoch=7, done=True))
        await asyncio.sleep(0.3)
        await asyncio.to_thread(b.start)
        # resend_after_s is 30 s, so the resend comes from the restart detection (a new server_id). ZeroMQ
        # may also deliver the chunks it queued while the buffer was down, and their acks can come before
        # the new server's credit grant: wait for both
        await until(lambda: not link.unacked and link.buffer_restarts, "the restart seen and every chunk acked", 20.0)
        assert link.server_id != first_server and link.buffer_restarts == 1
        learner = ctx.socket(zmq.DEALER)
        learner.setsockopt(zmq.LINGER, 0)
        learner.connect(f"tcp://127.0.0.1:{b.cfg.network.buffer_serve_port}")
        await learner.send_multipart(encode(BatchRequest(request_id=1, learner_version=0, max_episodes=6)))
        batch = decode(await asyncio.wait_for(learner.recv_multipart(), 15))
        assert sorted(batch.episode_ids) == ["a0", "a1", "a2", "b0", "b1", "b2"]
    finally:
        task.cancel()
        ctx.destroy(linger=0)


def test_slow_learner_bounds_memory_blocks_inserts_and_drops_nothing(buffer):
    b = buffer(max_items=6, eta=10, max_staleness=10, max_running=100, wal=False)
    b.start()
    ctx = zmq.Context()
    try:
        actor = _dealer(ctx, b.cfg.network.buffer_ingest_port)
        granted, seq = 0, 0
        for _ in range(4):  # ask again and again; the learner never comes
            actor.send_multipart(encode(CreditRequest("actor-t", 1, slots=100)))
            n = _recv(actor, CreditGrant).credits
            for _ in range(n):
                actor.send_multipart(chunk_frames(chunk(f"e{seq}", 0, seq=seq, done=True)))
                assert acks_in(_recv(actor, AckBatch)) == [(seq, "ok")]
                seq += 1
            granted += n
        assert granted == 6  # max_items episodes, not one more
        time.sleep(0.6)  # let the buffer notice (housekeeping) that the actor waits for credit
        m = scrape(b.metrics_url)
        assert m['turnstream_buffer_items{state="ready"}'] == 6
        assert m["turnstream_buffer_insert_blocked_seconds_total"] > 0
        assert not any(k.startswith("turnstream_buffer_dropped_episodes_total") and v for k, v in m.items())
        learner = _dealer(ctx, b.cfg.network.buffer_serve_port)
        learner.send_multipart(encode(BatchRequest(request_id=1, learner_version=0, max_episodes=2)))
        assert _recv(learner, Batch).episode_ids == ["e0", "e1"]
        actor.send_multipart(encode(CreditRequest("actor-t", 1, slots=100)))
        assert _recv(actor, CreditGrant).credits == 2  # serving made room: the actor may go on
    finally:
        ctx.destroy(linger=0)


def test_waiting_learner_is_answered_cancelled_when_the_buffer_stops(buffer):
    b = buffer(wal=False)
    b.start()
    ctx = zmq.Context()
    try:
        learner = _dealer(ctx, b.cfg.network.buffer_serve_port)
        learner.send_multipart(encode(BatchRequest(request_id=5, learner_version=0, max_episodes=2)))
        assert not learner.poll(300)  # blocked: nothing to serve yet, and no timeout was asked for
        os.kill(b.child.proc.pid, signal.SIGTERM)
        batch = _recv(learner, Batch)
        assert (batch.request_id, batch.status, batch.episode_ids) == (5, "cancelled", [])
        b.child.proc.wait(20)
    finally:
        ctx.destroy(linger=0)
