"""The socket options that let a role notice a silent peer and reach it again once it is back (the
behaviour itself, across a cut link: tests/integration/test_cluster_reconnect.py, which needs root)."""
from __future__ import annotations

import socket
import sys

import zmq

from turnstream.protocol.http_links import SILENT_PEER_S, silent_peer_socket
from turnstream.protocol.sockets import CONNECT_TIMEOUT_MS, configure


def test_every_zeromq_socket_gives_up_a_connect_that_gets_no_answer():
    ctx = zmq.Context()
    try:
        sock = configure(ctx.socket(zmq.DEALER))
        assert sock.getsockopt(zmq.CONNECT_TIMEOUT) == CONNECT_TIMEOUT_MS > 0
        assert sock.getsockopt(zmq.HEARTBEAT_IVL) > 0
        sock.close()
    finally:
        ctx.term()


def test_an_http_client_socket_probes_an_idle_peer_and_gives_up_a_silent_one():
    sock = silent_peer_socket((socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", 0)))
    try:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
        if sys.platform.startswith("linux"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == SILENT_PEER_S * 1000
            idle = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE)
            interval = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL)
            probes = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT)
            assert idle + interval * probes == SILENT_PEER_S
    finally:
        sock.close()

