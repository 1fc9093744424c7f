"""The buffer process: two ROUTER sockets (actors, learner), one SUB for versions, one event loop."""
from __future__ import annotations

import asyncio
import logging

import zmq
import zmq.asyncio

from buffer.episodes import flatten
from buffer.metrics import BufferMetrics
from buffer.store import ReplayStore
from protocol.codec import DecodeError, decode, encode
from protocol.messages import Ack, BatchRequest, CreditGrant, CreditRequest, TurnChunk, VersionAnnouncement
from protocol.sockets import configure

log = logging.getLogger("turnstream.buffer")


class BufferServer:
    def __init__(self, store: ReplayStore, metrics: BufferMetrics, *, ingest_addr: str, serve_addr: str,
                 version_addr: str | None, max_message_bytes: int):
        self.store, self.m = store, metrics
        self.ctx = zmq.asyncio.Context()
        self.ingest = configure(self.ctx.socket(zmq.ROUTER), max_bytes=max_message_bytes)
        self.serve = configure(self.ctx.socket(zmq.ROUTER), max_bytes=max_message_bytes)
        self.ingest_port = _bind(self.ingest, ingest_addr)
        self.serve_port = _bind(self.serve, serve_addr)
        self.versions = None
        if version_addr:
            self.versions = configure(self.ctx.socket(zmq.SUB))
            self.versions.setsockopt(zmq.SUBSCRIBE, b"")
            self.versions.connect(version_addr)
        self.max_message_bytes = max_message_bytes
        self.pending: dict[bytes, BatchRequest] = {}  # learner identity -> request waiting for data

    async def run(self) -> None:
        tasks = [self._ingest_loop(), self._serve_loop(), self._housekeeping_loop()]
        if self.versions is not None:
            tasks.append(self._version_loop())
        await asyncio.gather(*tasks)

    def close(self) -> None:
        self.ctx.destroy(linger=0)

    async def _ingest_loop(self) -> None:
        while True:
            identity, *frames = await self.ingest.recv_multipart(copy=False)
            identity = bytes(identity)
            try:
                msg = decode(frames, self.max_message_bytes)
            except DecodeError as exc:
                self.m.rejected.labels(exc.reason).inc()
                log.warning("bad message from an actor: %s", exc)
                continue
            if isinstance(msg, TurnChunk):
                status, reason = self.store.ingest(identity, msg)
                await self.ingest.send_multipart([identity, *encode(Ack(msg.seq, status, reason))])
                if reason:
                    log.warning("rejected chunk %s/%s/%s: %s", msg.actor_id, msg.epoch, msg.seq, reason)
            elif isinstance(msg, CreditRequest):
                self.store.on_credit_request(identity, msg.actor_id, msg.epoch, msg.slots)
            else:
                self.m.rejected.labels("unexpected_type").inc()
                continue
            await self._after_change()

    async def _serve_loop(self) -> None:
        while True:
            identity, *frames = await self.serve.recv_multipart(copy=False)
            try:
                msg = decode(frames, self.max_message_bytes)
            except DecodeError as exc:
                self.m.rejected.labels(exc.reason).inc()
                continue
            if not isinstance(msg, BatchRequest) or msg.max_episodes < 1:
                self.m.rejected.labels("unexpected_type").inc()
                continue
            self.pending[bytes(identity)] = msg
            await self._after_change()

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
            await asyncio.sleep(0.5)
            self.store.expire()
            await self._after_change()

    async def _after_change(self) -> None:
        """Serve waiting learners first (that frees admission room), then grant credits."""
        for identity, req in list(self.pending.items()):
            got = self.store.take_batch(req.learner_version, req.max_episodes)
            if got is None:
                continue
            episodes, dropped = got
            del self.pending[identity]
            batch = flatten(episodes, req.request_id, self.store.learner_version, dropped)
            await self.serve.send_multipart([identity, *encode(batch)], copy=False)
            self.m.batches.inc()
        for identity, n in self.store.grant_credits():
            grant = CreditGrant(credits=n, learner_version=self.store.learner_version)
            await self.ingest.send_multipart([identity, *encode(grant)])
        self.store.update_gauges()


def _bind(sock: zmq.Socket, addr: str) -> int:
    if addr.endswith(":0"):
        return sock.bind_to_random_port(addr.rsplit(":", 1)[0])
    sock.bind(addr)
    return int(addr.rsplit(":", 1)[1])
