"""The actor's connection to the buffer: credits in, chunks out, at-least-once with a bounded window.

Every chunk gets the next seq of this actor epoch and stays in `unacked` until the buffer acks it; it is
resent when no ack came within `resend_after_s` (the buffer drops the duplicate by (actor, epoch, seq)).
When the window is full, `send` waits: backpressure reaches the episodes instead of memory growing.
"""
from __future__ import annotations

import asyncio
import logging
import time

import zmq
import zmq.asyncio

from actors.metrics import ActorMetrics
from protocol.codec import DecodeError, decode, encode
from protocol.messages import Ack, CreditGrant, CreditRequest, TurnChunk
from protocol.sockets import configure

log = logging.getLogger("turnstream.actor")


class BufferLink:
    def __init__(self, ctx: zmq.asyncio.Context, addr: str, *, actor_id: str, epoch: int, slots: int,
                 max_unacked: int, resend_after_s: float, metrics: ActorMetrics, max_message_bytes: int,
                 heartbeat_s: float = 1.0):
        self.sock = configure(ctx.socket(zmq.DEALER), max_bytes=max_message_bytes)
        self.sock.connect(addr)
        self.actor_id, self.epoch, self.slots = actor_id, epoch, slots
        self.max_unacked, self.resend_after_s, self.heartbeat_s = max_unacked, resend_after_s, heartbeat_s
        self.m = metrics
        self.max_message_bytes = max_message_bytes
        self.next_seq = 0
        self.unacked: dict[int, tuple[float, TurnChunk]] = {}
        self.credits = 0
        self.learner_version = 0
        self._changed = asyncio.Condition()

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
        await self.sock.send_multipart(encode(chunk), copy=False)
        self.m.chunks_sent.inc()
        self.m.unacked.set(len(self.unacked))

    async def _recv_loop(self) -> None:
        while True:
            frames = await self.sock.recv_multipart(copy=False)
            try:
                msg = decode(frames, self.max_message_bytes)
            except DecodeError as exc:
                self.m.bad_messages.labels(exc.reason).inc()
                continue
            async with self._changed:
                if isinstance(msg, Ack):
                    if self.unacked.pop(msg.seq, None) is not None:
                        self.m.acks.labels(msg.status).inc()
                        if msg.status == "rejected":
                            log.error("buffer rejected chunk %d: %s", msg.seq, msg.reason)
                elif isinstance(msg, CreditGrant):
                    self.credits += msg.credits
                    self.learner_version = max(self.learner_version, msg.learner_version)
                else:
                    self.m.bad_messages.labels("unexpected_type").inc()
                self._changed.notify_all()
            self.m.unacked.set(len(self.unacked))

    async def _heartbeat_loop(self) -> None:
        """The credit request doubles as heartbeat; resend what waited too long for an ack."""
        while True:
            await self.sock.send_multipart(encode(CreditRequest(self.actor_id, self.epoch, self.slots)))
            now = time.monotonic()
            for seq, (sent, chunk) in list(self.unacked.items()):
                if now - sent > self.resend_after_s:
                    self.unacked[seq] = (now, chunk)
                    await self.sock.send_multipart(encode(chunk), copy=False)
                    self.m.resends.inc()
            await asyncio.sleep(self.heartbeat_s)
