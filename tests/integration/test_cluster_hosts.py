"""Roles on hosts of their own (tests/cluster.py): the buffer binds a non-loopback address in one network
namespace and an actor's socket reaches it from another across a bridge, with CURVE on; a peer host with a
wrong key is refused and counted while the buffer serves the allow-listed one; a cut link goes silent and what
was sent while it was down is acked once it is back. Skipped, saying why, where network
namespaces cannot be made."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.cluster import Cluster, cluster_unavailable
from tests.cluster_stack import BUFFER_METRICS, INGEST_PORT, ClusterStack, metric_total
from tests.helpers import poll_until, wait_for_child
from turnstream.keygen import main as keygen

pytestmark = pytest.mark.skipif(bool(reason := cluster_unavailable()), reason=reason or "")


# An actor's side of the wire, run inside its host: a credit, then one chunk per line of stdin ("send SEQ"),
# printing each reply (or "timeout") as a JSON line.
ACTOR_CLIENT = textwrap.dedent("""
    import json, sys
    import numpy as np, zmq
    from turnstream.protocol.auth import CurveKeys, make_client
    from turnstream.protocol.chunk_batch import pack
    from turnstream.protocol.codec import decode, encode
    from turnstream.protocol.messages import AckBatch, CreditGrant, CreditRequest, TurnChunk

    address, keys_dir, wait_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
    sock = make_client(zmq.Context().socket(zmq.DEALER), CurveKeys.load(keys_dir))
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)

    def reply(acks_only=False):
        # a buffer may grant credits in more than one message: after a chunk, only its ack is the reply
        while sock.poll(wait_s * 1000):
            msg = decode(sock.recv_multipart())
            if not isinstance(msg, CreditGrant):
                return {"acks": [[s, AckBatch.STATUSES[c]] for s, c in zip(msg.seq.tolist(), msg.status.tolist())]}
            if not acks_only:
                return {"credits": msg.credits}
        return "timeout"

    sock.send_multipart(encode(CreditRequest("actor-far", 1, slots=4)))
    print(json.dumps(reply()), flush=True)
    for line in sys.stdin:
        command, arg = line.split()
        if command == "send":
            seq = int(arg)
            chunk = TurnChunk(actor_id="actor-far", epoch=1, seq=seq, episode_id=f"e{seq}", turn=0,
                              prompt_key="p", obs_tokens=np.asarray([1, 2], np.int32),
                              gen_tokens=np.asarray([7], np.int32), gen_logprobs=np.full(1, -0.5, np.float32),
                              gen_versions=np.zeros(1, np.int32), reward=1.0, done=True)
            sock.send_multipart(encode(pack([chunk])))
        print(json.dumps(reply(acks_only=command == "send")), flush=True)   # "wait": only read what arrives
""")


@pytest.fixture
def buffer_on_its_own_host(tmp_path):
    with Cluster(["buffer", "actor"]) as cluster:
        stack = ClusterStack(cluster, tmp_path)
        try:
            child = stack.start_role("buffer")
            metrics_url = stack.url("buffer", BUFFER_METRICS)
            wait_for_child(lambda: cluster["actor"].get(metrics_url), "the buffer's metrics, across hosts",
                           child, timeout_s=60)
            yield cluster, stack.cfg.network.keys_dir, metrics_url
        finally:
            stack.procs.stop_all()


def _actor(cluster, keys, wait_s: float) -> subprocess.Popen:
    address = f"tcp://{cluster['buffer'].address}:{INGEST_PORT}"
    return subprocess.Popen(cluster["actor"].command([sys.executable, "-c", ACTOR_CLIENT, address, str(keys),
                                                      str(wait_s)]),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _ask(actor: subprocess.Popen, line: str):
    actor.stdin.write(line + "\n")
    actor.stdin.flush()
    return json.loads(actor.stdout.readline())


def _credit_then_an_ack(cluster, keys) -> None:
    """An actor host with the allow-listed key gets a credit, sends chunk 0 and has it acked."""
    actor = _actor(cluster, keys, wait_s=20)
    try:
        assert json.loads(actor.stdout.readline())["credits"] > 0
        assert _ask(actor, "send 0") == {"acks": [[0, "ok"]]}
    finally:
        actor.kill()
        actor.wait()


def test_an_actor_host_reaches_the_buffer_host_over_curve(buffer_on_its_own_host):
    cluster, keys, metrics_url = buffer_on_its_own_host
    assert not cluster["buffer"].address.startswith("127.")
    _credit_then_an_ack(cluster, keys)
    metrics = cluster["actor"].get(metrics_url)
    assert 'turnstream_buffer_chunks_total{outcome="ok"} 1.0' in metrics


def test_a_cut_link_is_silent_and_what_was_sent_is_acked_once_it_is_back(buffer_on_its_own_host):
    cluster, keys, metrics_url = buffer_on_its_own_host
    actor = _actor(cluster, keys, wait_s=3)
    try:
        assert json.loads(actor.stdout.readline())["credits"] > 0
        cluster.cut("actor")
        assert _ask(actor, "send 0") == "timeout"  # no reset, no error: the link is silent
        cluster.restore("actor")
        for _ in range(20):  # TCP retransmits on its own back-off, seconds apart
            if (reply := _ask(actor, "wait 0")) != "timeout":
                break
        assert reply == {"acks": [[0, "ok"]]}
    finally:
        actor.kill()
        actor.wait()
    assert 'turnstream_buffer_chunks_total{outcome="ok"} 1.0' in cluster["actor"].get(metrics_url)


def _stranger_keys(keys, tmp_path, wrong: str):
    """A key directory that is right but for one key: the client's own (one the buffer's allow-list does not
    hold) or the server's it pins (another server's)."""
    stranger = tmp_path / f"stranger-{wrong}"
    assert keygen(stranger) == 0  # a key set of its own
    if wrong == "client_key":  # pins the real server, presents an unlisted key
        (stranger / "server.key_secret").unlink()
        shutil.copy(Path(keys) / "server.key", stranger / "server.key")
    else:  # presents the listed client key, pins another server's
        shutil.copy(Path(keys) / "client.key_secret", stranger / "client.key_secret")
    return stranger


@pytest.mark.parametrize("wrong, reasons", [("client_key", ("auth",)), ("server_key", ("protocol", "no_detail"))])
def test_a_peer_host_with_a_wrong_curve_key_is_refused_counted_and_the_buffer_serves_on(buffer_on_its_own_host,
                                                                                     tmp_path, wrong, reasons):
    cluster, keys, metrics_url = buffer_on_its_own_host
    stranger = _actor(cluster, _stranger_keys(keys, tmp_path, wrong), wait_s=3)
    try:
        assert stranger.stdout.readline().strip() == '"timeout"'  # no credit: the handshake never completed

        def refusals() -> float:
            metrics = cluster["actor"].get(metrics_url)
            return sum(metric_total(metrics, f'turnstream_buffer_auth_failures_total{{reason="{r}",socket="ingest"}}')
                       for r in reasons)

        poll_until(refusals, f"a refusal counted across hosts ({' or '.join(reasons)})", timeout_s=30)
        _credit_then_an_ack(cluster, keys)  # the allow-listed peer, while the stranger still knocks
    finally:
        stranger.kill()
        stranger.wait()
    assert 'turnstream_buffer_chunks_total{outcome="ok"} 1.0' in cluster["actor"].get(metrics_url)


def test_the_cluster_removes_every_namespace_it_made():
    with Cluster(["a", "b"]) as cluster:
        made = cluster.namespaces()
        assert len(made) == 3
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
        assert all(name in listed for name in made)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not any(name in listed for name in made)
