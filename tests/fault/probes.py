"""What a process listens on, how much memory it holds, and hostile bytes for every kind of port."""
from __future__ import annotations

import os
import random
import socket

import zmq

GARBAGE_BYTES = 64 * 1024


def listening_ports(pid: int) -> set[int]:
    """TCP ports the process `pid` listens on (Linux /proc: its socket inodes joined with net/tcp*)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = open(f"/proc/{pid}/net/{table}").read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def rss_bytes(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"no VmRSS for {pid}")


def _closed_by_peer(sock: socket.socket, timeout_s: float = 10.0) -> bool:
    """Read until the peer closes; False if it keeps the connection open past the timeout."""
    sock.settimeout(timeout_s)
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def zmtp_garbage(port: int, rng: random.Random) -> bool:
    """Random bytes instead of a ZMTP greeting; True when the peer hung up on them."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        try:
            s.sendall(bytes(rng.getrandbits(8) for _ in range(GARBAGE_BYTES)))
        except (BrokenPipeError, ConnectionResetError):
            return True  # hung up before we finished sending
        return _closed_by_peer(s)


def _zmtp_handshake(s: socket.socket, socket_type: str) -> None:
    """ZMTP 3.0 greeting and NULL-mechanism READY, written by hand (the peer must see a valid client)."""
    s.sendall(b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" * 32)
    name, value = b"Socket-Type", socket_type.encode()
    body = b"\x05READY" + bytes([len(name)]) + name + len(value).to_bytes(4, "big") + value
    s.sendall(bytes([0x04, len(body)]) + body)  # a short command frame


def zmtp_oversized(port: int, socket_type: str, *, claimed: int, payload: bytes = b"") -> bool:
    """After a valid handshake, one message frame that claims `claimed` bytes and carries `payload`
    (a small message first, as a well-behaved peer would send). True when the peer hung up.

    A 1 TiB claim must be refused from the 9-byte header alone (ZMQ_MAXMSGSIZE), without waiting for or
    allocating the bytes; a real frame above max_message_bytes likewise.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        _zmtp_handshake(s, socket_type)
        small = b"\x07not a real message"
        try:
            s.sendall(bytes([0x00, len(small)]) + small)
            s.sendall(b"\x02" + claimed.to_bytes(8, "big") + payload)  # a long message frame
        except (BrokenPipeError, ConnectionResetError):
            return True
        return _closed_by_peer(s)


def zmq_undecodable(ctx: zmq.Context, port: int, oversized_bytes: int) -> None:
    """Through a real DEALER: messages our codec must reject (counted), and one above max_message_bytes.

    (No such probe uses a pyzmq XSUB for the PUB port: libzmq 4.3.5 crashes the *sending* process when an
    XSUB holding a multi-MiB subscription is closed, so the PUB gets hand-written ZMTP frames instead.)"""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(f"tcp://127.0.0.1:{port}")
    for frames in ([b"\x00garbage"], [b"\x81\xa1v\x63"], [b""], [b"\xff" * 1000, b"\x00" * 10]):
        sock.send_multipart(frames)
    sock.send(b"\x00" * oversized_bytes)
    sock.close()  # LINGER: the messages leave before the socket goes


def http_attacks(port: int, rng: random.Random) -> list[bytes]:
    """Garbage, a 1 MiB header line and an 8 MiB body on the metrics port; the status line of each answer.

    Every answer must be an HTTP 4xx (or a hang-up), never a crash or a hang.
    """
    requests = [
        bytes(rng.getrandbits(8) for _ in range(GARBAGE_BYTES)) + b"\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n",
        b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (8 << 20) + b"z" * (8 << 20),
        b"GET /" + b"%" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    ]
    answers = []
    for req in requests:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            try:
                s.sendall(req)
            except (BrokenPipeError, ConnectionResetError, socket.timeout):
                pass  # the server answered (and closed, or stopped reading) before taking it all: fine
            s.settimeout(10)
            try:
                answers.append(s.recv(256).split(b"\r\n", 1)[0])
            except ConnectionResetError:
                answers.append(b"")
    return answers
