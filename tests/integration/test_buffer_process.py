"""The buffer as a real process, driven over real ZeroMQ sockets on 127.0.0.1."""
from __future__ import annotations

import sys
import time

import pytest
import zmq

from turnstream.protocol.chunk_batch import pack
from turnstream.protocol.codec import decode, encode
from turnstream.protocol.messages import (AckBatch, Batch, BatchRequest, CreditGrant, CreditRequest,
                               VersionAnnouncement)
from tests.helpers import acks_in, chunk, chunk_frames, scrape, wait_for_child
from turnstream.core.config import Config
from turnstream.launch.processes import ProcessGroup, free_port


@pytest.fixture
def buffer_proc(tmp_path):
    cfg = Config()
    cfg.run.run_dir = str(tmp_path / "run")  # the buffer's write-ahead log lives here
    cfg.network.buffer_ingest_port = free_port()
    cfg.network.buffer_serve_port = free_port()
    cfg.network.learner_pub_port = free_port()
    cfg.buffer.metrics_port = free_port()
    cfg.buffer.batch_episodes = 2
    cfg.buffer.eta = 1
    cfg.buffer.max_staleness = 1
    path = tmp_path / "config.toml"
    path.write_text(cfg.dumps())
    ctx = zmq.Context()
    procs = ProcessGroup(tmp_path)
    # torn down also when set-up fails: a context left to the garbage collector can block its term() forever
    # and hang the whole session in whichever later test happens to collect it
    try:
        pub = ctx.socket(zmq.PUB)  # the test plays the learner's version publisher
        pub.setsockopt(zmq.LINGER, 0)
        pub.bind(f"tcp://127.0.0.1:{cfg.network.learner_pub_port}")
        child = procs.start("buffer", [sys.executable, "-m", "turnstream.cli", "buffer", "--config", str(path)])
        metrics_url = f"http://127.0.0.1:{cfg.buffer.metrics_port}/metrics"
        wait_for_child(lambda: scrape(metrics_url), "the buffer's metrics", child, timeout_s=30)
        yield cfg, ctx, pub, metrics_url, child
    finally:
        procs.stop_all()
        ctx.destroy(linger=0)


def _dealer(ctx, port):
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://127.0.0.1:{port}")
    return sock


def _recv(sock, timeout_s=10.0):
    assert sock.poll(timeout_s * 1000), "no reply"
    return decode(sock.recv_multipart())


def test_credits_acks_dedup_and_batch(buffer_proc):
    cfg, ctx, _pub, metrics_url, _ = buffer_proc
    actor = _dealer(ctx, cfg.network.buffer_ingest_port)
    actor.send_multipart(encode(CreditRequest("actor-t", 1, slots=8)))
    grant = _recv(actor)
    # eta=1, B=2, version 0: (eta + v + 1) * B = 4 episodes may run before the learner moves on
    assert isinstance(grant, CreditGrant) and grant.credits == 4

    sent = {}
    seq = 0
    for ep in ("e1", "e2"):
        for turn in range(3):
            c = chunk(ep, turn, seq=seq, done=turn == 2, reward=1.0 if turn == 2 else 0.0,
                      obs=(10 + turn, 11 + turn), gen=(20 + turn,))
            sent[(ep, turn)] = c
            actor.send_multipart(chunk_frames(c))
            assert acks_in(_recv(actor)) == [(seq, "ok")]
            seq += 1
    actor.send_multipart(chunk_frames(sent[("e1", 1)]))  # a resend after a lost ack
    assert acks_in(_recv(actor)) == [(1, "duplicate")]

    learner = _dealer(ctx, cfg.network.buffer_serve_port)
    learner.send_multipart(encode(BatchRequest(request_id=1, learner_version=0, max_episodes=2)))
    batch = _recv(learner)
    assert isinstance(batch, Batch) and batch.episode_ids == ["e1", "e2"]
    assert batch.returns == [1.0, 1.0]
    # exactly the tokens that were sent, in turn order, with only generated tokens marked as actions
    first = batch.tokens[batch.episode_offsets[0]:batch.episode_offsets[1]].tolist()
    assert first == [10, 11, 20, 11, 12, 21, 12, 13, 22]
    assert batch.action_mask[: len(first)].tolist() == [0, 0, 1, 0, 0, 1, 0, 0, 1]

    m = scrape(metrics_url)
    assert m['turnstream_buffer_chunks_total{outcome="ok"}'] == 6
    assert m['turnstream_buffer_chunks_total{outcome="duplicate"}'] == 1


def test_stale_episodes_never_reach_the_learner(buffer_proc):
    cfg, ctx, pub, metrics_url, _ = buffer_proc
    actor = _dealer(ctx, cfg.network.buffer_ingest_port)
    actor.send_multipart(encode(CreditRequest("actor-t", 1, slots=4)))
    _recv(actor)
    for i, version in enumerate((0, 0, 5, 5)):
        actor.send_multipart(chunk_frames(chunk(f"v{version}-{i}", 0, seq=i, done=True, version=version)))
        assert acks_in(_recv(actor)) == [(i, "ok")]
    time.sleep(0.3)  # PUB/SUB joins asynchronously
    for _ in range(5):
        pub.send_multipart(encode(VersionAnnouncement(version=6)))
        time.sleep(0.1)
    learner = _dealer(ctx, cfg.network.buffer_serve_port)
    learner.send_multipart(encode(BatchRequest(request_id=7, learner_version=6, max_episodes=2)))
    batch = _recv(learner)
    # max_staleness=1: the two version-0 episodes are 6 versions old and are dropped, not served
    assert batch.episode_ids == ["v5-2", "v5-3"]
    assert int((batch.learner_version - batch.versions[batch.action_mask == 1]).max()) <= 1
    m = scrape(metrics_url)
    assert m['turnstream_buffer_dropped_episodes_total{reason="stale"}'] == 2


def test_a_batch_lost_with_its_connection_is_sent_again_on_the_re_ask(buffer_proc):
    """A learner stalled past the heartbeat timeout loses the answer queued on its dropped connection; it
    reconnects under the same routing id and re-asks the same request id, and must get the same episodes."""
    cfg, ctx, _pub, metrics_url, _ = buffer_proc
    actor = _dealer(ctx, cfg.network.buffer_ingest_port)
    actor.send_multipart(encode(CreditRequest("actor-t", 1, slots=4)))
    _recv(actor)
    for i in range(4):
        actor.send_multipart(chunk_frames(chunk(f"e{i}", 0, seq=i, done=True)))
        assert acks_in(_recv(actor)) == [(i, "ok")]

    def learner_socket():
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTING_ID, b"learner-stalled")
        sock.connect(f"tcp://127.0.0.1:{cfg.network.buffer_serve_port}")
        return sock

    stalled = learner_socket()
    stalled.send_multipart(encode(BatchRequest(request_id=1, learner_version=0, max_episodes=2)))
    assert stalled.poll(10_000), "no answer to the first request"  # answered, and never read
    reconnected = learner_socket()  # the buffer still holds the old connection: the new one takes it over
    reconnected.send_multipart(encode(BatchRequest(request_id=1, learner_version=0, max_episodes=2)))
    again = _recv(reconnected)
    assert isinstance(again, Batch) and again.request_id == 1 and again.episode_ids == ["e0", "e1"]
    assert decode(stalled.recv_multipart()).episode_ids == again.episode_ids  # the very batch that was lost

    reconnected.send_multipart(encode(BatchRequest(request_id=2, learner_version=0, max_episodes=2)))
    assert _recv(reconnected).episode_ids == ["e2", "e3"]  # the next request moves on, nothing served twice
    m = scrape(metrics_url)
    assert m["turnstream_buffer_batches_served_total"] == 2
    assert m['turnstream_buffer_batch_requests_total{outcome="repeat"}'] == 1


def test_garbage_is_counted_and_the_buffer_keeps_serving(buffer_proc):
    cfg, ctx, _pub, metrics_url, child = buffer_proc
    actor = _dealer(ctx, cfg.network.buffer_ingest_port)
    actor.send_multipart([b"\xff\x00garbage"])
    actor.send_multipart([b"\x93\x01\x02", b"x" * 100])
    actor.send_multipart(encode(CreditRequest("actor-t", 1, slots=1)))
    assert isinstance(_recv(actor), CreditGrant)
    bad = chunk("bad", 0, seq=0, done=True)
    bad.gen_logprobs[:] = 3.0  # a positive log-probability is impossible
    actor.send_multipart(chunk_frames(bad))
    ack = _recv(actor)
    assert acks_in(ack) == [(0, "rejected")] and ack.reasons == ["bad_logprob"]
    actor.send_multipart(chunk_frames(chunk("good", 0, seq=1, done=True)))
    assert acks_in(_recv(actor)) == [(1, "ok")]
    assert child.proc.poll() is None
    m = scrape(metrics_url)
    assert m['turnstream_buffer_rejected_total{reason="bad_header"}'] >= 1
    assert m['turnstream_buffer_rejected_total{reason="bad_logprob"}'] == 1


def test_packed_chunks_are_acked_together_and_a_malformed_pack_is_refused(buffer_proc):
    cfg, ctx, _pub, metrics_url, child = buffer_proc
    actor = _dealer(ctx, cfg.network.buffer_ingest_port)
    good = [chunk(f"p{i}", 0, seq=i, done=True, obs=(1, 2, i + 3), gen=(7, 8)) for i in range(5)]
    bad = chunk("bad", 0, seq=5, done=True)
    bad.gen_logprobs[:] = 3.0
    actor.send_multipart(encode(pack([*good, bad])))
    acks = _recv(actor)
    assert isinstance(acks, AckBatch)
    assert acks.seq.tolist() == [0, 1, 2, 3, 4, 5]
    assert [AckBatch.STATUSES[s] for s in acks.status] == ["ok"] * 5 + ["rejected"]
    assert acks.reasons == ["bad_logprob"]

    broken = pack([chunk("q0", 0, seq=6, done=True), chunk("q1", 0, seq=7, done=True)])
    broken.obs_len[0] += 1  # lengths no longer add up to the concatenated tokens
    actor.send_multipart(encode(broken))
    acks = _recv(actor)
    assert acks.seq.tolist() == [6, 7] and acks.reasons == ["bad_batch", "bad_batch"]
    assert child.proc.poll() is None

    learner = _dealer(ctx, cfg.network.buffer_serve_port)
    learner.send_multipart(encode(BatchRequest(request_id=1, learner_version=0, max_episodes=2)))
    batch = _recv(learner)
    assert batch.episode_ids == ["p0", "p1"]
    assert batch.tokens[batch.episode_offsets[1]:batch.episode_offsets[2]].tolist() == [1, 2, 4, 7, 8]
    m = scrape(metrics_url)
    assert m['turnstream_buffer_chunks_total{outcome="ok"}'] == 5
    assert m['turnstream_buffer_chunks_total{outcome="rejected"}'] == 3
    assert m['turnstream_buffer_rejected_total{reason="bad_batch"}'] == 1


def test_the_buffer_binds_on_bind_host_and_reaches_the_learner_on_learner_host(tmp_path):
    """Multi-host wiring: `host` names an address this machine does not have (TEST-NET-1), so the buffer
    works only if it binds on network.bind_host and subscribes to network.learner_host."""
    cfg = Config()
    cfg.run.run_dir = str(tmp_path / "run")
    cfg.network.host, cfg.network.curve = "192.0.2.1", "off"
    cfg.network.bind_host = cfg.network.learner_host = "127.0.0.1"
    cfg.network.buffer_ingest_port, cfg.network.buffer_serve_port = free_port(), free_port()
    cfg.network.learner_pub_port, cfg.buffer.metrics_port = free_port(), free_port()
    path = tmp_path / "config.toml"
    path.write_text(cfg.dumps())
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{cfg.network.learner_pub_port}")
    procs = ProcessGroup(tmp_path)
    child = procs.start("buffer", [sys.executable, "-m", "turnstream.cli", "buffer", "--config", str(path)])
    try:
        actor = _dealer(ctx, cfg.network.buffer_ingest_port)
        actor.send_multipart(encode(CreditRequest("actor-h", 1, slots=1)))
        assert isinstance(_recv(actor, timeout_s=30), CreditGrant), "the buffer is not listening on bind_host"
        deadline = time.monotonic() + 20
        while True:  # the SUB connects in the background; announce until the buffer has heard it
            pub.send_multipart(encode(VersionAnnouncement(version=3)))
            if scrape(f"http://127.0.0.1:{cfg.buffer.metrics_port}/metrics")["turnstream_buffer_learner_version"] == 3:
                break
            assert time.monotonic() < deadline, "the buffer never heard the learner on learner_host"
            time.sleep(0.2)
        assert child.proc.poll() is None
    finally:
        procs.stop_all()
        ctx.destroy(linger=0)
