"""The buffer process: two ROUTER sockets (actors, learner), one SUB for versions, one event loop.

Ingest drains every message already queued (up to `drain_max`) and applies them to the store; their acks
join an ack group (buffer/acks.py) that leaves after a short delay, with the chunks that arrive meanwhile.
The write-ahead log is committed once for the group (group commit), and only then are its acks sent: an
ack means "in the log per the fsync policy". Each batch request is a task waiting on a Gate that every
state change notifies, so a request blocks until its batch exists, its timeout passes, or the buffer shuts
down.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid

import zmq
import zmq.asyncio

from turnstream.buffer.acks import AckGroup
from turnstream.buffer.audit import BufferAudit
from turnstream.buffer.durability.journal import WalJournal
from turnstream.buffer.store.episodes import flatten
from turnstream.buffer.metrics import BufferMetrics
from turnstream.buffer.store.ratelimit import BlockedClock, Cancelled, Gate
from turnstream.buffer.store.replay_store import ReplayStore
from turnstream.protocol import auth
from turnstream.protocol.codec import DecodeError, decode, encode
from turnstream.protocol.loop_socket import LoopSocket
from turnstream.protocol.messages import BatchRequest, CreditGrant, CreditRequest, TurnChunkBatch, VersionAnnouncement
from turnstream.protocol.sockets import configure, subscriber

log = logging.getLogger("turnstream.buffer")


class BufferServer:
    def __init__(self, store: ReplayStore, metrics: BufferMetrics, *, ingest_addr: str, serve_addr: str,
                 version_addr: str | None, max_message_bytes: int, journal: WalJournal | None = None,
                 audit: BufferAudit | None = None, drain_max: int = 256, housekeeping_s: float = 0.5,
                 ack_delay_s: float = 0.0, curve: auth.CurveKeys | None = None):
        self.store, self.m, self.journal, self.audit = store, metrics, journal, audit
        self.server_id = uuid.uuid4().hex[:16]  # a new one per start tells actors to resend their window
        self.ctx = zmq.asyncio.Context()
        self.ingest = configure(self.ctx.socket(zmq.ROUTER, socket_class=zmq.Socket), max_bytes=max_message_bytes)
        self.serve = configure(self.ctx.socket(zmq.ROUTER), max_bytes=max_message_bytes)
        # A learner that reconnects under its routing id (after a stall past the heartbeat timeout, say) takes
        # its identity over from the old connection that the ROUTER may still hold, instead of being refused.
        self.serve.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.monitors: dict[str, zmq.Socket] = {}  # socket name -> monitor of refused handshakes (CURVE only)
        self.authenticator, self.refusals = None, 0
        if curve is not None:  # must precede bind: the mechanism is fixed per socket before peers arrive
            self.authenticator = auth.start_authenticator(self.ctx, curve)
            for name, sock in (("ingest", self.ingest), ("serve", self.serve)):
                auth.make_server(sock, curve)
                self.monitors[name] = auth.refusal_monitor(sock)
        self.ingest_port = _bind(self.ingest, ingest_addr)
        self.ingest_io = LoopSocket(self.ingest)
        self.serve_port = _bind(self.serve, serve_addr)
        self.versions = None
        if version_addr:
            self.versions = subscriber(self.ctx, version_addr, curve)
        self.max_message_bytes, self.drain_max, self.housekeeping_s = max_message_bytes, drain_max, housekeeping_s
        self.acks = AckGroup(ack_delay_s)
        self.gate = Gate()
        self.requests: dict[bytes, asyncio.Task] = {}  # learner identity -> task answering its request
        # learner identity -> (request_id, frames) of the last batch sent, kept until the learner asks for the
        # next one: an answer can be lost with its connection, and the re-ask must get the same batch again
        self.last_batch: dict[bytes, tuple[int, list]] = {}
        self.insert_clock = BlockedClock(metrics.insert_blocked)
        self.sample_clock = BlockedClock(metrics.sample_blocked)
        self.waiting_requests = 0

    async def run(self) -> None:
        tasks = [self._ingest_loop(), self._serve_loop(), self._housekeeping_loop()]
        if self.versions is not None:
            tasks.append(self._version_loop())
        tasks += [auth.count_refusals(mon, self._refused_counter(name)) for name, mon in self.monitors.items()]
        await asyncio.gather(*tasks)

    async def shutdown(self) -> None:
        """Answer every waiting batch request with status "cancelled" instead of leaving it hanging."""
        self.gate.cancel()
        if self.requests:
            await asyncio.wait(list(self.requests.values()), timeout=1.0)

    def close(self) -> None:
        self.ingest_io.unwatch()
        self.serve.close(linger=500)  # let the "cancelled" answers of shutdown() reach the learners
        if self.authenticator is not None:
            self.authenticator.stop()
        self.ctx.destroy(linger=0)
        if self.journal is not None:
            self.journal.close()
        if self.audit is not None:
            self.audit.close()

    def _commit(self) -> None:
        """Before acks or a batch leave: the log durable per its fsync policy, then the audit's ack lines."""
        if self.journal is not None:
            self.journal.commit()
        if self.audit is not None:
            self.audit.committed()

    def _refused_counter(self, socket_name: str):
        def refused(reason: str) -> None:
            self.m.auth_failures.labels(socket_name, reason).inc()
            self.refusals += 1
            # log the 1st, 2nd, 4th, 8th ... refusal: a stranger reconnecting every 100 ms must not flood the log
            if self.refusals & (self.refusals - 1) == 0:
                log.warning("refused a peer on the %s socket: CURVE handshake failed (%s); %d refusals so far",
                            socket_name, reason, self.refusals)
        return refused

    # ---- actors ------------------------------------------------------------------------------------
    async def _ingest_loop(self) -> None:
        while True:
            heartbeats: set[bytes] = set()
            if await self.ingest_io.readable(self.acks.wait_s()):
                # Drain what is already queued. A ROUTER send never waits (a full peer pipe drops, and the
                # actor resends). Frames are kept as received, zero-copy: the stored arrays are views into them.
                batch = []
                while len(batch) < self.drain_max and (frames := self.ingest_io.recv_now()) is not None:
                    batch.append(frames)
                heartbeats = self._apply_ingest(batch)
            # a credit request is answered at once: an actor without credits has nothing else to send
            if heartbeats or self.acks.due():
                self._commit()  # before any ack leaves
                for reply in self.acks.take_replies():
                    self.ingest_io.send_now(reply)
                await self._after_change(heartbeats)

    def _apply_ingest(self, batch: list) -> set[bytes]:
        """Apply one drained group of messages: each chunk's ack joins the ack group. Returns the actors
        whose credit request gets an answer (even of 0 credits)."""
        heartbeats: set[bytes] = set()
        for peer, *frames in batch:
            identity = peer.bytes
            try:
                msg = decode(frames, self.max_message_bytes)
            except DecodeError as exc:
                self.m.rejected.labels(exc.reason).inc()
                log.warning("bad message from an actor: %s", exc)
                continue
            if isinstance(msg, TurnChunkBatch):
                self.acks.add(identity, self.store.ingest_message(identity, msg, frames))
            elif isinstance(msg, CreditRequest):
                self.store.admission.on_credit_request(identity, msg.actor_id, msg.epoch, msg.slots)
                heartbeats.add(identity)
            else:
                self.m.rejected.labels("unexpected_type").inc()
        return heartbeats

    # ---- learner -----------------------------------------------------------------------------------
    async def _serve_loop(self) -> None:
        while True:
            identity, *frames = await self.serve.recv_multipart(copy=False)
            try:
                msg = decode(frames, self.max_message_bytes)
            except DecodeError as exc:
                self.m.rejected.labels(exc.reason).inc()
                continue
            if not isinstance(msg, BatchRequest) or msg.max_episodes < 1 or msg.max_tokens < 0 \
                    or not msg.timeout_s >= 0:
                self.m.rejected.labels("unexpected_type" if not isinstance(msg, BatchRequest)
                                       else "bad_request").inc()
                continue
            identity = bytes(identity)
            last = self.last_batch.get(identity)
            if last is not None and last[0] == msg.request_id:
                # The learner did not get our answer (lost with a torn-down connection) or re-asked while it
                # was on the wire. Its episodes are consumed, so the same batch goes again, never a new one.
                self.m.batch_requests.labels("repeat").inc()
                await self.serve.send_multipart([identity, *last[1]], copy=False)
                continue
            self.last_batch.pop(identity, None)  # a new request id: the learner has its previous batch
            old = self.requests.pop(identity, None)
            if old is not None:
                old.cancel()  # a peer re-asking replaces its earlier request (one per peer)
            self.requests[identity] = asyncio.create_task(self._answer(identity, msg))

    async def _answer(self, identity: bytes, req: BatchRequest) -> None:
        self.waiting_requests += 1
        self._update_clocks()
        status, got = "ok", None
        try:
            got = await self.gate.wait_for(
                lambda: self.store.take_batch(req.learner_version, req.max_episodes, req.max_tokens),
                req.timeout_s or None)
        except TimeoutError:
            status = "timeout"
        except Cancelled:
            status = "cancelled"
        finally:
            self.waiting_requests -= 1
            self._update_clocks()
            if self.requests.get(identity) is asyncio.current_task():
                del self.requests[identity]
        self.m.batch_requests.labels(status).inc()
        if got is not None:
            episodes, dropped = got
            self._commit()  # "consumed" is durable before the batch leaves
            frames = encode(flatten(episodes, req.request_id, self.store.learner_version, dropped))
            self._keep_last_batch(identity, req.request_id, frames)
            self.m.batches.inc()
        else:
            batch = flatten([], req.request_id, self.store.learner_version, 0)
            batch.status = status
            frames = encode(batch)
        await self.serve.send_multipart([identity, *frames], copy=False)
        await self._after_change()  # serving freed admission room

    def _keep_last_batch(self, identity: bytes, request_id: int, frames: list) -> None:
        self.last_batch[identity] = (request_id, frames)
        # learners that died holding an answer are never heard from again: keep the newest few only
        if len(self.last_batch) > MAX_KEPT_BATCHES:  # one entry per request, so one eviction suffices
            del self.last_batch[next(iter(self.last_batch))]

    async def _version_loop(self) -> None:
        while True:
            frames = await self.versions.recv_multipart(copy=False)
            try:
                msg = decode(frames, self.max_message_bytes)
            except DecodeError as exc:
                self.m.rejected.labels(exc.reason).inc()
                continue
            if isinstance(msg, VersionAnnouncement):
                self.store.set_learner_version(msg.version)
                await self._after_change()

    async def _housekeeping_loop(self) -> None:
        while True:
            await asyncio.sleep(self.housekeeping_s)
            self.store.expire()
            if self.journal is not None:
                self.journal.housekeeping(self.store)
            await self._after_change()

    async def _after_change(self, heartbeats: set[bytes] = frozenset()) -> None:
        """Wake waiting learners first (serving frees admission room), then grant credits."""
        self.gate.notify()
        await asyncio.sleep(0)  # let woken requests take their batches before credits are computed
        grants = dict(self.store.grant_credits())
        for identity in set(grants) | set(heartbeats):
            grant = CreditGrant(credits=grants.get(identity, 0), learner_version=self.store.learner_version,
                                server_id=self.server_id)
            self.ingest_io.send_now([identity, *encode(grant)])
        self._update_clocks()

    def _update_clocks(self) -> None:
        now = time.monotonic()
        self.insert_clock.update(self.store.admission.wanted() > 0 and self.store.capacity() == 0, now)
        self.sample_clock.update(self.waiting_requests > 0, now)


MAX_KEPT_BATCHES = 16  # last answers kept, one per learner identity; far more than learner processes in a run


def _bind(sock: zmq.Socket, addr: str) -> int:
    if addr.endswith(":0"):
        return sock.bind_to_random_port(addr.rsplit(":", 1)[0])
    sock.bind(addr)
    return int(addr.rsplit(":", 1)[1])
