"""The learner process with CURVE on (network.curve = "on"): its version PUB socket lets an allow-listed
subscriber in, refuses a stranger's key and a plaintext peer, and counts each refusal in /metrics as the
buffer does (turnstream_learner_auth_failures_total{socket="pub", reason}).

No vLLM server is needed: the learner's first weight push to the unreachable URL fails, is counted, and
the learner serves on (learner/serve.py), which is all this test needs of it.
"""
from __future__ import annotations

import sys

import pytest
import zmq
from zmq.utils.monitor import parse_monitor_message

from turnstream.protocol import auth
from tests.helpers import scrape, wait_for_child
from turnstream.core.config import Config
from turnstream.keygen import main as keygen
from turnstream.launch.processes import ProcessGroup, free_port


def _connect_and_watch(sock: zmq.Socket, addr: str, timeout_s: float = 20.0) -> set[int]:
    """Connect `sock` and return the handshake outcome its own monitor reports (the client's side)."""
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                                      | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
    sock.connect(addr)  # after the monitor: the handshake's events cannot slip past it
    seen = set()
    if monitor.poll(timeout_s * 1000):
        seen.add(parse_monitor_message(monitor.recv_multipart())["event"])
    sock.disable_monitor()
    monitor.close()
    return seen


@pytest.fixture
def keys(tmp_path):
    assert keygen(tmp_path / "keys") == 0
    return auth.CurveKeys.load(tmp_path / "keys")


def test_learner_pub_refuses_and_counts_strangers(tmp_path, tiny_model, keys):
    cfg = Config()
    cfg.run.run_dir = str(tmp_path / "run")
    cfg.model.path = str(tiny_model)
    cfg.vllm.urls = [f"http://127.0.0.1:{free_port()}"]  # nothing listens there
    cfg.network.curve, cfg.network.keys_dir = "on", str(keys.keys_dir)
    for name in ("buffer_ingest_port", "buffer_serve_port", "learner_pub_port"):
        setattr(cfg.network, name, free_port())
    cfg.learner.metrics_port = free_port()
    path = tmp_path / "config.toml"
    path.write_text(cfg.dumps())
    procs = ProcessGroup(tmp_path)
    learner = procs.start("learner", [sys.executable, "-m", "turnstream.cli", "learner", "--config", str(path)])
    url = f"http://127.0.0.1:{cfg.learner.metrics_port}/metrics"
    addr = f"tcp://127.0.0.1:{cfg.network.learner_pub_port}"
    ctx = zmq.Context()
    try:
        wait_for_child(lambda: scrape(url), "the learner's /metrics", learner)

        def subscriber(kind: str) -> zmq.Socket:
            sock = ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            if kind == "keyed":
                auth.make_client(sock, keys)
            elif kind == "stranger":  # pins the right server key, but its own key is not on the allow-list
                public, secret = zmq.curve_keypair()
                sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = keys.server_public, public, secret
            return sock

        keyed, stranger, plain = subscriber("keyed"), subscriber("stranger"), subscriber("plaintext")
        events = {"keyed": _connect_and_watch(keyed, addr), "stranger": _connect_and_watch(stranger, addr)}
        plain.connect(addr)
        assert events["keyed"] == {zmq.EVENT_HANDSHAKE_SUCCEEDED}, events
        assert zmq.EVENT_HANDSHAKE_SUCCEEDED not in events["stranger"], events

        def counted(reasons) -> float:
            m = scrape(url)
            return sum(m.get(f'turnstream_learner_auth_failures_total{{reason="{r}",socket="pub"}}', 0)
                       for r in reasons)

        wait_for_child(lambda: counted(["auth"]) >= 1, "the stranger's refusal counted", learner)
        # a plaintext peer is a mechanism mismatch, reported as "protocol" or without detail depending on timing
        wait_for_child(lambda: counted(["protocol", "no_detail"]) >= 1, "the plaintext peer's refusal counted", learner)
        assert "refused a peer on the pub socket" in learner.log_path.read_text()
        assert learner.proc.poll() is None
    finally:
        ctx.destroy(linger=0)
        procs.stop_all()
