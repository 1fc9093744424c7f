"""The actor's connection to the buffer: credits in, chunks out, at-least-once with a bounded window.

Every chunk gets the next seq of this actor epoch and stays in `unacked` until the buffer acks it; it is
resent when no ack came within `resend_after_s` (the buffer drops the duplicate by (actor, epoch, seq)).
When the window is full, `send` waits: backpressure reaches the episodes instead of memory growing.
`send` only queues: one sender task writes the queue out, packing small chunks that queued up meanwhile
into one `turn_chunks` message (no added delay: a batch is whatever accumulated while the previous send
ran), and sending each large one in a message of its own, zero-copy.

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
from collections import Counter, deque

import zmq
import zmq.asyncio

from turnstream.actors.metrics import ActorMetrics
from turnstream.protocol.auth import CurveKeys, make_client
from turnstream.protocol.codec import DecodeError, decode, encode
from turnstream.protocol.chunk_batch import chunk_nbytes, pack
from turnstream.protocol.loop_socket import LoopSocket
from turnstream.protocol.messages import AckBatch, CreditGrant, CreditRequest, TurnChunk
from turnstream.protocol.sockets import configure

log = logging.getLogger("turnstream.actor")

PACK_BELOW_BYTES = 64 * 1024  # a chunk this large is sent alone: packing would copy it for no gain
MAX_PACKED_BYTES = 256 * 1024
MAX_PACKED_CHUNKS = 512


class BufferLink:
    def __init__(self, ctx: zmq.asyncio.Context, addr: str, *, actor_id: str, epoch: int, slots: int,
                 max_unacked: int, resend_after_s: float, metrics: ActorMetrics, max_message_bytes: int,
                 heartbeat_s: float = 1.0, curve: CurveKeys | None = None):
        self.sock = configure(ctx.socket(zmq.DEALER, socket_class=zmq.Socket), max_bytes=max_message_bytes)
        if curve is not None:
            make_client(self.sock, curve)  # before connect: keys are read when the handshake starts
        self.sock.connect(addr)
        self.io = LoopSocket(self.sock)
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
        self._outbox: deque[TurnChunk] = deque()
        self._outbox_ready = asyncio.Event()

    async def run(self) -> None:
        try:
            await asyncio.gather(self._recv_loop(), self._send_loop(), self._heartbeat_loop())
        finally:
            self.io.unwatch()

    def want_slots(self, slots: int) -> None:
        """The episodes the actor could run now (its runner's gate changes it as episodes wait on their
        environment); the buffer hears it with the next credit request, level-triggered."""
        self.slots = slots

    async def acquire_credit(self) -> str:
        """Take one credit; returns the id of the buffer that granted it (for return_credit)."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.credits > 0)
            self.credits -= 1
            return self.server_id

    async def return_credit(self, server_id: str) -> None:
        """An episode ended before streaming a chunk. The buffer counts a credit as used only when an
        episode's first chunk arrives, so it still holds this one as granted and unused: keep it for the next
        episode. Dropping it would leak admission room, and a burst of failed first turns would shrink the
        actor's concurrency for good. A credit from a buffer that has since restarted died with it."""
        async with self._changed:
            if server_id == self.server_id:
                self.credits += 1
                self._changed.notify()

    async def send(self, chunk: TurnChunk) -> None:
        if len(self.unacked) >= self.max_unacked:  # else no lock: nothing else runs until this returns
            async with self._changed:
                await self._changed.wait_for(lambda: len(self.unacked) < self.max_unacked)
        chunk.seq = self.next_seq
        self.next_seq += 1
        self.unacked[chunk.seq] = (time.monotonic(), chunk)
        self._outbox.append(chunk)
        self._outbox_ready.set()

    async def delivered(self, seq: int) -> None:
        """Return once chunk `seq` is acked: the buffer holds it durably."""
        if seq in self.unacked:
            async with self._changed:
                await self._changed.wait_for(lambda: seq not in self.unacked)

    async def _send_loop(self) -> None:
        while True:
            await self._outbox_ready.wait()
            self._outbox_ready.clear()
            chunks = list(self._outbox)
            self._outbox.clear()
            await self._send_chunks(chunks)
            self.m.chunks_sent.inc(len(chunks))
            self.m.unacked.set(len(self.unacked))

    async def _send_chunks(self, chunks: list[TurnChunk]) -> None:
        """Encode every chunk, then send the messages in one go (one read of the socket's state after them)."""
        await self.io.send_all([encode(pack(group)) for group in packing_groups(chunks)])

    async def _recv_loop(self) -> None:
        while True:
            await self.io.readable()
            for _ in range(256):  # drain what is queued, then wake the waiters once
                frames = self.io.recv_now()
                if frames is None:
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
        if isinstance(msg, AckBatch):
            statuses, codes = AckBatch.STATUSES, msg.status.tolist()  # a few acks: lists beat numpy reductions
            if msg.seq.shape != msg.status.shape or max(codes, default=0) >= len(statuses):
                self.m.bad_messages.labels("bad_batch").inc()
                return
            self._on_acks(msg.seq.tolist(), [statuses[code] for code in codes], msg.reasons)
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

    def _on_acks(self, seqs: list[int], statuses: list[str], reasons: list[str]) -> None:
        counts: Counter[str] = Counter()
        rejected = iter(reasons)
        for seq, status in zip(seqs, statuses):
            reason = next(rejected, "?") if status == "rejected" else ""
            if self.unacked.pop(seq, None) is not None:
                counts[status] += 1
                if reason:
                    log.error("buffer rejected chunk %d: %s", seq, reason)
        for status, n in counts.items():
            counter = self._ack_counters.get(status)
            if counter is None:  # statuses are a small fixed set; labels() is costly per ack
                counter = self._ack_counters[status] = self.m.acks.labels(status[:32])
            counter.inc(n)

    async def _heartbeat_loop(self) -> None:
        """The credit request doubles as heartbeat; resend what waited too long for an ack."""
        while True:
            await self.io.send(encode(CreditRequest(self.actor_id, self.epoch, self.slots)))
            await self._resend(everything=self._resend_all)
            self._resend_all = False
            self._wake_sender.clear()
            try:
                await asyncio.wait_for(self._wake_sender.wait(), self.heartbeat_s)
            except asyncio.TimeoutError:
                pass

    async def _resend(self, everything: bool) -> None:
        now = time.monotonic()
        due = [chunk for seq, (sent, chunk) in sorted(self.unacked.items())
               if everything or now - sent > self.resend_after_s]
        for chunk in due:
            self.unacked[chunk.seq] = (now, chunk)
        if due:
            await self._send_chunks(due)
            self.m.resends.inc(len(due))


def packing_groups(chunks: list[TurnChunk]) -> list[list[TurnChunk]]:
    """The chunks grouped into the messages they travel in: a large chunk alone (its arrays go out zero-copy),
    small ones together, up to MAX_PACKED_CHUNKS and MAX_PACKED_BYTES a message."""
    groups: list[list[TurnChunk]] = []
    small: list[TurnChunk] = []
    small_bytes = 0
    for chunk in chunks:
        size = chunk_nbytes(chunk)
        if size >= PACK_BELOW_BYTES:
            groups.append([chunk])
            continue
        if not small or small_bytes + size > MAX_PACKED_BYTES or len(small) == MAX_PACKED_CHUNKS:
            small, small_bytes = [], 0
            groups.append(small)
        small.append(chunk)
        small_bytes += size
    return groups
