"""The bench's own receivers and its CPU clock (benchmarks/dataplane.py): child-process scripts that stand in
for the buffer, so that the bench can compare what the buffer costs against what the transport costs."""
from __future__ import annotations

import os
from pathlib import Path


class CpuClock:
    """CPU seconds spent by this process and by a receiver process between start() and stop()."""

    def __init__(self, receiver_pid: int):
        self.receiver_pid = receiver_pid

    def start(self) -> None:
        self.begin = self._read()

    def stop(self, chunks: int) -> dict[str, float]:
        """µs per chunk: sender (this process), receiver, and the receiver's main thread; {} off Linux."""
        end = self._read()
        if None in end or None in self.begin:
            return {}
        names = ("sender_cpu_us", "receiver_cpu_us", "receiver_main_cpu_us")
        return {name: round((b - a) / chunks * 1e6, 1) for name, a, b in zip(names, self.begin, end)}

    def _read(self) -> tuple:
        pid = self.receiver_pid
        return (cpu_seconds(f"/proc/{os.getpid()}/stat"), cpu_seconds(f"/proc/{pid}/stat"),
                cpu_seconds(f"/proc/{pid}/task/{pid}/stat"))


def stat_fields(stat_path: str) -> list[str] | None:
    """The fields of a /proc stat file after the command name (state first, then ppid, pgrp, ...)."""
    try:
        return Path(stat_path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def cpu_seconds(stat_path: str, fields: list[str] | None = None) -> float | None:
    """utime + stime from a /proc stat file (the process's threads together, or one thread's), or from its
    fields already read."""
    fields = fields or stat_fields(stat_path)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

RECEIVER = r"""
import sys, zmq
port, n = int(sys.argv[1]), int(sys.argv[2])
ctx = zmq.Context()
pull = ctx.socket(zmq.PULL); pull.setsockopt(zmq.RCVHWM, 10000); pull.bind(f"tcp://127.0.0.1:{port}")
rep = ctx.socket(zmq.PAIR); rep.bind(f"tcp://127.0.0.1:{sys.argv[3]}")
rep.send(b"ready")  # set up: the clock may start
rep.recv()  # "go"
for _ in range(n):
    pull.recv_multipart(copy=False)
rep.send(b"done")
rep.recv()  # stay alive until the parent has read this process's CPU time
"""


ACKER = r"""
import asyncio, sys, msgpack, zmq
from turnstream.buffer.acks import AckGroup
from turnstream.protocol.codec import encode
from turnstream.protocol.loop_socket import LoopSocket
from turnstream.protocol.messages import CreditGrant
port, ctl, ack_delay_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
ctx = zmq.Context()
router = ctx.socket(zmq.ROUTER); router.setsockopt(zmq.RCVHWM, 10000); router.bind(f"tcp://127.0.0.1:{port}")
rep = ctx.socket(zmq.PAIR); rep.bind(f"tcp://127.0.0.1:{ctl}")
rep.send(b"ready")


async def serve():  # as the buffer's ingest loop, minus its work: the same socket driver and delayed acks
    io, acks, kept = LoopSocket(router), AckGroup(ack_delay_s), []
    while True:
        if await io.readable(acks.wait_s()):
            while (msg := io.recv_now()) is not None:
                kept.append(msg)
                peer, header, *_arrays = msg
                header = msgpack.unpackb(header)  # the header only: no decode
                if header["t"] == "turn_chunks":
                    acks.add(peer.bytes, [(seq, "ok", "") for seq in header["f"]["seq"]])
                elif header["t"] == "credit_request":  # the buffer's answer, without credits
                    io.send_now([peer, *encode(CreditGrant(0, server_id="acker"))])
        if acks.due():
            for reply in acks.take_replies():
                io.send_now(reply)


asyncio.run(serve())
"""
