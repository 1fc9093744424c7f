"""CURVE on real sockets on 127.0.0.1 (curve forced on): allow-listed peers talk, strangers are refused and counted.

The buffer runs in-process (its own context and ZAP authenticator), a real BufferLink plays the actor, raw
DEALERs play the strangers, and a CURVE PUB with its own authenticator plays the learner.
"""
from __future__ import annotations

import asyncio
import sys
import time

import pytest
import zmq
import zmq.asyncio

from turnstream.actors.link import BufferLink
from turnstream.actors.metrics import ActorMetrics
from turnstream.learner.batch_client import BatchClient
from turnstream.protocol import auth
from turnstream.protocol.codec import decode, encode
from turnstream.protocol.messages import CreditGrant, CreditRequest, VersionAnnouncement
from tests.helpers import chunk, chunk_frames, in_process_buffer, scrape, stop_in_process_buffer, until
from turnstream.core.config import Config
from turnstream.keygen import main as keygen
from turnstream.launch.processes import ProcessGroup, free_port


@pytest.fixture
def keys(tmp_path):
    assert keygen(tmp_path / "keys") == 0
    return auth.CurveKeys.load(tmp_path / "keys")


def _server(keys, version_addr=None):
    return in_process_buffer(batch_episodes=1, version_addr=version_addr, housekeeping_s=0.1, curve=keys)


def _failures(metrics, socket, reason):
    return metrics.registry.get_sample_value("turnstream_buffer_auth_failures_total",
                                             {"socket": socket, "reason": reason}) or 0.0


async def test_keyed_peers_exchange_messages_over_curve(keys):
    # the learner's PUB is a CURVE server with its own authenticator; the buffer's SUB is its client
    pub_ctx = zmq.asyncio.Context()
    pub_auth = auth.start_authenticator(pub_ctx, keys)
    pub = auth.make_server(pub_ctx.socket(zmq.PUB), keys)
    pub.setsockopt(zmq.LINGER, 0)
    pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
    server, store, metrics = _server(keys, version_addr=f"tcp://127.0.0.1:{pub_port}")
    ctx = zmq.asyncio.Context()
    link = BufferLink(ctx, f"tcp://127.0.0.1:{server.ingest_port}", actor_id="actor-k", epoch=1, slots=4,
                      max_unacked=8, resend_after_s=0.5, metrics=ActorMetrics(), max_message_bytes=1 << 20,
                      heartbeat_s=0.05, curve=keys)
    tasks = [asyncio.create_task(t) for t in (server.run(), link.run())]
    try:
        await until(lambda: link.server_id, "a credit grant over CURVE")
        await link.send(chunk("e0", 0, seq=0, actor_id="actor-k", epoch=1, done=True, obs=(1,), gen=(2,)))
        await until(lambda: not link.unacked, "the ack")
        assert metrics.registry.get_sample_value("turnstream_buffer_chunks_total", {"outcome": "ok"}) == 1
        # the learner's DEALER to the serve ROUTER
        learner = BatchClient(ctx, f"tcp://127.0.0.1:{server.serve_port}", 1 << 20, keys)
        batch = await asyncio.wait_for(learner.get(0, 1, retry_s=1.0), 10)
        assert batch.status == "ok" and list(batch.episode_ids) == ["e0"]

        async def announce():
            while store.learner_version != 3:
                await pub.send_multipart(encode(VersionAnnouncement(3)))  # PUB drops until the SUB has joined
                await asyncio.sleep(0.05)
        await asyncio.wait_for(announce(), 10)
        reasons = auth.REFUSAL_EVENTS.values()
        assert sum(_failures(metrics, s, r) for s in ("ingest", "serve") for r in reasons) == 0
    finally:
        await stop_in_process_buffer(tasks, server, ctx)
        pub_auth.stop()
        pub_ctx.destroy(linger=0)


@pytest.mark.parametrize("stranger", ["unknown_key", "plaintext"])
async def test_strangers_are_refused_and_counted(keys, stranger):
    server, store, metrics = _server(keys)
    ctx = zmq.asyncio.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    if stranger == "unknown_key":  # knows the server's public key, but its own key is not on the allow-list
        public, secret = zmq.curve_keypair()
        dealer.curve_serverkey, dealer.curve_publickey, dealer.curve_secretkey = keys.server_public, public, secret
    dealer.connect(f"tcp://127.0.0.1:{server.ingest_port}")
    task = asyncio.create_task(server.run())
    # a plaintext peer is a mechanism mismatch, reported as "protocol" or without detail depending on timing
    reasons = ("auth",) if stranger == "unknown_key" else ("protocol", "no_detail")
    try:
        for _ in range(3):
            await dealer.send_multipart(encode(CreditRequest("intruder", 1, 4)), zmq.NOBLOCK)
            await dealer.send_multipart(chunk_frames(chunk("x0", 0, seq=0, actor_id="intruder", epoch=1, done=True)),
                                        zmq.NOBLOCK)
    except zmq.Again:
        pass  # no completed handshake, so nothing may even be queued: that is the point
    try:
        await until(lambda: sum(_failures(metrics, "ingest", r) for r in reasons) >= 1,
                    f"a counted refusal ({' or '.join(reasons)})")
        assert not await dealer.poll(500), "a refused peer got an answer"
        assert (metrics.registry.get_sample_value("turnstream_buffer_chunks_total", {"outcome": "ok"}) or 0) == 0
        assert not store.in_progress and not store.ready
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        server.close()
        ctx.destroy(linger=0)


def test_buffer_process_with_curve_on(tmp_path, keys):
    """The wiring in buffer/main.py: a keyed DEALER gets a grant, a plaintext one shows up in /metrics."""
    cfg = Config()
    cfg.run.run_dir = str(tmp_path / "run")
    cfg.network.curve = "on"
    cfg.network.keys_dir = str(keys.keys_dir)
    cfg.network.buffer_ingest_port = free_port()
    cfg.network.buffer_serve_port = free_port()
    cfg.buffer.metrics_port = free_port()
    path = tmp_path / "config.toml"
    path.write_text(cfg.dumps())
    procs = ProcessGroup(tmp_path)
    child = procs.start("buffer", [sys.executable, "-m", "turnstream.cli", "buffer", "--config", str(path)])
    ctx = zmq.Context()
    try:
        url = f"http://127.0.0.1:{cfg.buffer.metrics_port}/metrics"
        deadline = time.monotonic() + 30
        while True:
            try:
                scrape(url)
                break
            except OSError:
                assert child.proc.poll() is None, (tmp_path / "logs" / "buffer.log").read_text()
                assert time.monotonic() < deadline, "buffer did not come up"
                time.sleep(0.2)
        addr = f"tcp://127.0.0.1:{cfg.network.buffer_ingest_port}"
        good = auth.make_client(ctx.socket(zmq.DEALER), keys)
        plain = ctx.socket(zmq.DEALER)
        for sock in (good, plain):
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(addr)
        good.send_multipart(encode(CreditRequest("actor-0", 1, 4)))
        assert good.poll(10_000), "no grant for a keyed actor"
        assert isinstance(decode(good.recv_multipart()), CreditGrant)
        deadline = time.monotonic() + 10
        refused = ['turnstream_buffer_auth_failures_total{reason="%s",socket="ingest"}' % r
                   for r in ("protocol", "no_detail")]
        while not any(k in scrape(url) for k in refused):
            assert time.monotonic() < deadline, "plaintext peer not counted"
            time.sleep(0.2)
        assert not plain.poll(200)
    finally:
        procs.stop_all()
        ctx.destroy(linger=0)
