"""The actor's connection to the buffer: credits in, chunks out, at-least-once with a bounded window.

Every chunk gets the next seq of this actor epoch and stays in `unacked` until the buffer acks it; it is
resent when no ack came within `resend_after_s` (the buffer drops the duplicate by (actor, epoch, seq)).
When the window is full, `send` waits: backpressure reaches the episodes instead of memory growing.

The credit request, sent every `heartbeat_s`, is also the actor's hello and heartbeat: a restarted buffer
learns the actor from it, and its answer (a CreditGrant, possibly of 0 credits) carries the buffer's
`server_id`. A new server_id means the buffer restarted: credits granted by the old one are void, and
the whole unacked window is resent at once (the buffer's write-ahead log answers "duplicate" for chunks
it had already acked).
"""
from __future__ import annotations

import asyncio
import logging
import time

import zmq
import zmq.asyncio

from actors.metrics import ActorMetrics
from protocol.auth import CurveKeys, make_client
from protocol.codec import DecodeError, decode, encode
from protocol.messages import Ack, CreditGrant, CreditRequest, TurnChunk
from protocol.sockets import configure

log = logging.getLogger("turnstream.actor")


class BufferLink:
    def __init__(self, ctx: zmq.asyncio.Context, addr: str, *, actor_id: str, epoch: int, slots: int,
                 max_unacked: int, resend_after_s: float, metrics: ActorMetrics, max_message_bytes: int,
                 heartbeat_s: float = 1.0, curve: CurveKeys | None = None):
        self.sock = configure(ctx.socket(zmq.DEALER), max_bytes=max_message_bytes)
        if curve is not None:
            make_client(self.sock, curve)  # before connect: keys are read when the handshake starts
        self.sock.connect(addr)
        self.actor_id, self.epoch, self.slots = actor_id, epoch, slots
        self.max_unacked, self.resend_after_s, self.heartbeat_s = max_unacked, resend_after_s, heartbeat_s
        self.m = metrics
        self.max_message_bytes = max_message_bytes
        self.next_seq = 0
        self.unacked: dict[int, tuple[float, TurnChunk]] = {}
        self.credits = 0
        self.learner_version = 0
        self.server_id = ""
        self.buffer_restarts = 0
        self._changed = asyncio.Condition()
        self._resend_all = False
        self._ack_counters: dict = {}
        self._wake_sender = asyncio.Event()

    async def run(self) -> None:
        await asyncio.gather(self._recv_loop(), self._heartbeat_loop())

    async def acquire_credit(self) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.credits > 0)
            self.credits -= 1

    async def send(self, chunk: TurnChunk) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: len(self.unacked) < self.max_unacked)
            chunk.seq = self.next_seq
            self.next_seq += 1
            self.unacked[chunk.seq] = (time.monotonic(), chunk)
        await self._send(encode(chunk))
        self.m.chunks_sent.inc()
        self.m.unacked.set(len(self.unacked))

    async def _send(self, frames: list) -> None:
        # Always through the asyncio wrapper: a plain send here, while _recv_loop waits, can swallow the
        # socket's edge-triggered readiness signal and leave that receive asleep for good.
        await self.sock.send_multipart(frames, copy=False)

    async def _recv_loop(self) -> None:
        while True:
            frames = await self.sock.recv_multipart(copy=False)
            self._on_message(frames)
            for _ in range(256):  # drain what is queued; a non-blocking receive skips the future machinery
                try:
                    frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False).result()
                except zmq.Again:
                    break
                self._on_message(frames)
            self.m.unacked.set(len(self.unacked))
            async with self._changed:
                self._changed.notify_all()
            if self._resend_all:
                self._wake_sender.set()

    def _on_message(self, frames: list) -> None:
        """Apply one ack or grant; the caller wakes waiters once per drained group of messages."""
        try:
            msg = decode(frames, self.max_message_bytes)
        except DecodeError as exc:
            self.m.bad_messages.labels(exc.reason).inc()
            return
        if isinstance(msg, Ack):
            if self.unacked.pop(msg.seq, None) is not None:
                counter = self._ack_counters.get(msg.status)
                if counter is None:  # statuses are a small fixed set; labels() is costly per ack
                    counter = self._ack_counters[msg.status] = self.m.acks.labels(msg.status[:32])
                counter.inc()
                if msg.status == "rejected":
                    log.error("buffer rejected chunk %d: %s", msg.seq, msg.reason)
        elif isinstance(msg, CreditGrant):
            restarted = bool(msg.server_id and self.server_id and msg.server_id != self.server_id)
            if msg.server_id:
                self.server_id = msg.server_id
            if restarted:
                self.buffer_restarts += 1
                log.warning("buffer restarted (server %s): resending %d unacked chunks",
                            msg.server_id, len(self.unacked))
                self.credits = msg.credits  # the old buffer's unused credits died with it
                self._resend_all = True
            else:
                self.credits += msg.credits
            self.learner_version = max(self.learner_version, msg.learner_version)
        else:
            self.m.bad_messages.labels("unexpected_type").inc()

    async def _heartbeat_loop(self) -> None:
        """The credit request doubles as heartbeat; resend what waited too long for an ack."""
        while True:
            await self._send(encode(CreditRequest(self.actor_id, self.epoch, self.slots)))
            await self._resend(everything=self._resend_all)
            self._resend_all = False
            self._wake_sender.clear()
            try:
                await asyncio.wait_for(self._wake_sender.wait(), self.heartbeat_s)
            except asyncio.TimeoutError:
                pass

    async def _resend(self, everything: bool) -> None:
        now = time.monotonic()
        for seq, (sent, chunk) in sorted(self.unacked.items()):
            if seq not in self.unacked:
                continue  # acked while an earlier resend was awaiting the socket
            if everything or now - sent > self.resend_after_s:
                self.unacked[seq] = (now, chunk)
                await self._send(encode(chunk))
                self.m.resends.inc()
