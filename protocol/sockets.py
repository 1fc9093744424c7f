"""ZeroMQ socket construction with the options every role wants."""
from __future__ import annotations

import zmq

from turnstream.protocol import auth
from turnstream.protocol.codec import DEFAULT_MAX_MESSAGE_BYTES

CONNECT_TIMEOUT_MS = 2000  # a TCP handshake takes one round trip; 2 s leaves room for one lost SYN


def configure(sock: zmq.Socket, *, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, hwm: int = 10_000) -> zmq.Socket:
    sock.setsockopt(zmq.LINGER, 0)
    # ZeroMQ drops an oversized message before the application sees it; +4 KiB leaves room for the header.
    sock.setsockopt(zmq.MAXMSGSIZE, max_bytes + 4096)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    # ZMTP heartbeats detect dead TCP peers that never said goodbye.
    sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 5000)
    sock.setsockopt(zmq.HEARTBEAT_TTL, 6000)
    # A connect that gets no answer (the peer's link is down) is given up after this long and tried afresh.
    # Left to the kernel, one connect() retransmits its SYN at doubling intervals (1, 3, 7, 15, 31, 63 s ...),
    # so a peer back from a partition would be reached only at the next retransmission: up to as long again
    # as the partition had lasted. Connecting sockets only; one SYN per interval while a peer is away.
    sock.setsockopt(zmq.CONNECT_TIMEOUT, CONNECT_TIMEOUT_MS)
    return sock


def bind_address(host: str, port: int) -> str:
    return f"tcp://{host}:{port}"


def subscriber(ctx: zmq.Context, address: str, curve: auth.CurveKeys | None = None) -> zmq.Socket:
    """A SUB socket on every topic of the PUB at `address` (the learner's version announcements)."""
    sock = configure(ctx.socket(zmq.SUB))
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    if curve is not None:
        auth.make_client(sock, curve)
    sock.connect(address)
    return sock
