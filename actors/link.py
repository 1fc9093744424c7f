"""The actor's connection to the buffer: credits in, chunks out, at-least-once with a bounded window.

Every chunk gets the next seq of this actor epoch and stays in `unacked` until the buffer acks it; it is
resent when no ack came within `resend_after_s` (the buffer drops the duplicate by (actor, epoch, seq)).
When the window is full, `send` waits: backpressure reaches the episodes instead of memory growing.
`send` only queues: one sender task writes the queue out, packing small chunks that queued up meanwhile
into one `turn_chunks` message (no added delay: a batch is whatever accumulated while the previous send
ran), and sending large ones alone, zero-copy. To a buffer that takes them, the messages of one send go out
as bundles (several messages in one multipart message, protocol/SCHEMA.md), which the buffer wakes for once.

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
from turnstream.protocol.messages import Ack, AckBatch, CreditGrant, CreditRequest, TurnChunk
from turnstream.protocol.sockets import configure

log = logging.getLogger("turnstream.actor")

PACK_BELOW_BYTES = 64 * 1024  # a chunk this large is sent alone: packing would copy it for no gain
MAX_PACKED_BYTES = 256 * 1024
MAX_PACKED_CHUNKS = 512
# A bundle is acked once all of it is applied. Packed small chunks gain nothing more from bundling, and a
# bundle of a few packed messages could hold an actor's whole window: no chunk would be acked until all were
# applied, and the actor would stop sending meanwhile (2 KB chunks ran at two thirds of their rate).
MAX_BUNDLE_CHUNKS = 8


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
        self.unsigned_tokens = False  # the buffer takes token ids as uint32: large chunks go so (no sign to check)
        self.message_bundles = False  # the buffer takes several messages in one (protocol.codec.decode_bundle)
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
        messages: list[tuple[list, int]] = []  # (frames, chunks in them)
        group: list[TurnChunk] = []
        group_bytes = 0
        for chunk in chunks:
            size = chunk_nbytes(chunk)
            if size >= PACK_BELOW_BYTES:  # alone: its arrays go out zero-copy
                messages.append((encode(chunk, alt_dtypes=self.unsigned_tokens), 1))
                continue
            if group and (group_bytes + size > MAX_PACKED_BYTES or len(group) == MAX_PACKED_CHUNKS):
                messages.append((_encode_group(group), len(group)))
                group, group_bytes = [], 0
            group.append(chunk)
            group_bytes += size
        if group:
            messages.append((_encode_group(group), len(group)))
        if self.message_bundles:
            await self.io.send_all(bundle(messages, self.max_message_bytes))
        else:
            await self.io.send_all([frames for frames, _ in messages])

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
        if isinstance(msg, Ack):
            self._on_acks([msg.seq], [msg.status], [msg.reason] if msg.status == "rejected" else [])
        elif isinstance(msg, AckBatch):
            statuses, codes = AckBatch.STATUSES, msg.status.tolist()  # a few acks: lists beat numpy reductions
            if msg.seq.shape != msg.status.shape or max(codes, default=0) >= len(statuses):
                self.m.bad_messages.labels("bad_batch").inc()
                return
            self._on_acks(msg.seq.tolist(), [statuses[code] for code in codes], msg.reasons)
        elif isinstance(msg, CreditGrant):
            restarted = bool(msg.server_id and self.server_id and msg.server_id != self.server_id)
            if msg.server_id:
                self.server_id = msg.server_id
            self.unsigned_tokens, self.message_bundles = msg.unsigned_tokens, msg.message_bundles
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
            if self.unacked.pop(seq, None) is not None:
                counts[status] += 1
                if status == "rejected":
                    log.error("buffer rejected chunk %d: %s", seq, next(rejected, "?"))
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


def _encode_group(group: list[TurnChunk]) -> list:
    return encode(group[0] if len(group) == 1 else pack(group))


def bundle(messages: list[tuple[list, int]], max_bytes: int) -> list[list]:
    """Messages (frames, the chunks they carry), in order, joined into bundles of up to MAX_BUNDLE_CHUNKS
    chunks and max_bytes (SCHEMA.md); a message of more chunks goes alone. A receiver wakes, and a ROUTER adds
    the peer's identity, once per bundle instead of once per message."""
    bundles: list[list] = []
    current: list = []
    chunks = size = 0
    for frames, n in messages:
        nbytes = sum(map(len, frames))  # bytes or memoryviews cast to "B": len is the byte count
        if current and (chunks + n > MAX_BUNDLE_CHUNKS or size + nbytes > max_bytes):
            bundles.append(current)
            current, chunks, size = [], 0, 0
        current += frames
        chunks += n
        size += nbytes
    if current:
        bundles.append(current)
    return bundles
