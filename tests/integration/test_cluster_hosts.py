"""Roles on hosts of their own (tests/cluster.py): the buffer binds a non-loopback address in one network
namespace and an actor's socket reaches it from another across a bridge, with CURVE on; a cut link goes
silent and what was sent while it was down is acked once it is back. Skipped, saying why, where network
namespaces cannot be made."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.cluster import Cluster, cluster_unavailable
from tests.cluster_stack import BUFFER_METRICS, INGEST_PORT, ClusterStack
from tests.helpers import wait_for_child

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

    def reply():
        if not sock.poll(wait_s * 1000):
            return "timeout"
        msg = decode(sock.recv_multipart())
        if isinstance(msg, CreditGrant):
            return {"credits": msg.credits}
        return {"acks": [[s, AckBatch.STATUSES[c]] for s, c in zip(msg.seq.tolist(), msg.status.tolist())]}

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
        print(json.dumps(reply()), flush=True)   # "wait": only read what arrives
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


def test_an_actor_host_reaches_the_buffer_host_over_curve(buffer_on_its_own_host):
    cluster, keys, metrics_url = buffer_on_its_own_host
    assert not cluster["buffer"].address.startswith("127.")
    actor = _actor(cluster, keys, wait_s=20)
    try:
        assert json.loads(actor.stdout.readline())["credits"] > 0
        assert _ask(actor, "send 0") == {"acks": [[0, "ok"]]}
    finally:
        actor.kill()
        actor.wait()
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


def test_the_cluster_removes_every_namespace_it_made():
    with Cluster(["a", "b"]) as cluster:
        made = cluster.namespaces()
        assert len(made) == 3
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
        assert all(name in listed for name in made)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not any(name in listed for name in made)
