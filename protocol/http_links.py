"""HTTP client connections that notice a silent peer: TCP keepalive and a user timeout on every socket.

A partition (a link down, a host gone without a word) leaves a TCP connection open with nobody answering.
Data sent into it is retransmitted at doubling intervals for many minutes, and a request waiting for its
answer waits as long as its own time limit allows, which must be generous for slow work (a weight reload,
a long generation). With keepalive probes on idle connections and TCP_USER_TIMEOUT on unacknowledged data,
the kernel ends such a connection after about SILENT_PEER_S, whatever the request's time limit, while a peer
that is busy but alive answers the probes and keeps its connection. Costs one small probe per idle
connection every few seconds.
"""
from __future__ import annotations

import socket
import sys

import aiohttp

KEEPIDLE_S, KEEPINTVL_S, KEEPCNT = 5, 2, 3  # idle before the first probe, between probes, probes unanswered
SILENT_PEER_S = KEEPIDLE_S + KEEPINTVL_S * KEEPCNT


def silent_peer_socket(addr_info) -> socket.socket:
    """aiohttp's socket_factory: a TCP socket that gives up on a peer silent for about SILENT_PEER_S."""
    family, kind, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=kind, proto=proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if sys.platform.startswith("linux"):  # the per-socket tuning is Linux's; elsewhere the system's keepalive
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPIDLE_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPINTVL_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPCNT)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, SILENT_PEER_S * 1000)
    return sock


def silent_peer_connector(**kwargs) -> aiohttp.TCPConnector:
    """A TCPConnector (kwargs as aiohttp's) whose connections notice a silent peer."""
    return aiohttp.TCPConnector(socket_factory=silent_peer_socket, **kwargs)
