"""Receive the buffer's large frames into recycled, pre-faulted slabs instead of fresh memory per message.

Why: a buffer keeps what it receives. With plain `recv_multipart`, libzmq allocates every large frame
afresh (glibc serves big allocations from new mmap'd pages), and every kept megabyte first takes page
faults. Here, frames of at least `MIN_POOLED_FRAME` bytes are copied by `recv_into` into slabs that were
touched once at start-up; libzmq's own buffer is freed at once, so malloc hands the same warm memory back
for the next message. The decoded arrays are views into the slab. 1 MB chunks arrive 1.1-1.7x faster
(`turnstream bench dataplane`: ours against ours_nopool, BENCHMARKS.md "Data plane").

A slab is reused once nothing refers to it any more: every chunk held in the store keeps its slab alive
through its arrays (numpy views), so a slab comes back when all of its chunks are trained or dropped.
CPython's reference count tells that directly (`sys.getrefcount`); no bookkeeping can go stale.
When no slab is free the frame is received the plain way (counted): the pool bounds memory it reserves,
never what the buffer may hold (`buffer.max_items` does that).

keep_receive_buffers_warm() does the same for libzmq's own receive buffers, through glibc's thresholds.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys
from dataclasses import dataclass

import numpy as np
import zmq

from protocol.codec import DecodeError, declared_frame_bytes, parse_header

MIN_POOLED_FRAME = 64 * 1024  # smaller allocations come from malloc's arenas, which recycle on their own
SLAB_BYTES = 16 * 1024 * 1024
ALIGN = 64  # each frame starts on a cache line (and a numpy-friendly alignment)


class SlabPool:
    def __init__(self, capacity_bytes: int, slab_bytes: int = SLAB_BYTES):
        # touched once here (fill writes every page), so that receiving never waits on a page fault
        self.slabs = [np.ones(slab_bytes, np.uint8) for _ in range(max(0, capacity_bytes) // slab_bytes)]
        self.slab_bytes = slab_bytes
        self.current, self.offset = 0, 0

    def take(self, nbytes: int) -> memoryview | None:
        """A writable region of nbytes in a slab, or None when the pool has no room."""
        if not self.slabs or nbytes > self.slab_bytes:
            return None
        if self.offset + nbytes > self.slab_bytes and not self._next_free_slab():
            return None
        start = self.offset
        self.offset = -(-(start + nbytes) // ALIGN) * ALIGN
        return memoryview(self.slabs[self.current][start:start + nbytes])

    def _next_free_slab(self) -> bool:
        for step in range(1, len(self.slabs) + 1):
            i = (self.current + step) % len(self.slabs)
            # 2 references: the list's and getrefcount's argument; any other is a view still in use
            if sys.getrefcount(self.slabs[i]) == 2:
                self.current, self.offset = i, 0
                return True
        return False


# glibc mallopt parameters (malloc.h) and the values this module sets
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's largest on 64-bit: allocations below come from its heaps
TRIM_THRESHOLD_BYTES = 64 * 1024 * 1024  # free heap memory kept warm beyond what is in use


def keep_receive_buffers_warm() -> bool:
    """Make glibc's malloc serve libzmq's large receive buffers from its heaps and keep freed ones mapped.

    Why: the pool copies each large frame out of libzmq's buffer, which is then freed. By default glibc
    serves a 1 MB allocation with a fresh mmap until its adaptive threshold rises, and it returns freed heap
    tops to the kernel, so libzmq's next buffer often takes page faults again; which of the two happens
    varies run to run. Fixed thresholds make the buffer for the next frame the warm one just freed
    (BENCHMARKS.md, "Data plane"). Process-wide, so the buffer's entry point calls it once. Returns
    whether the allocator took both settings (False off glibc, where this is a no-op)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    took_mmap = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    return bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)) and took_mmap


@dataclass
class Received:
    identity: bytes
    frames: list  # frame 0 (the header) as bytes, then array frames (slab regions or zmq Frames)
    header: dict | None = None  # frame 0 parsed, when it parsed (decode() reuses it)
    error: DecodeError | None = None  # a frame did not match the size its header declared


class SlabReceiver:
    """Takes one ROUTER message at a time off a socket, its declared large frames into the pool."""

    def __init__(self, pool: SlabPool, max_message_bytes: int):
        self.pool, self.max_message_bytes = pool, max_message_bytes
        self.misses = 0  # large frames received the plain way because no slab had room

    def receive(self, sock: zmq.Socket) -> Received | None:
        """The next queued message, or None when none is queued. Never blocks: a multipart message
        arrives whole, so once its first frame is there, so are the others."""
        try:
            identity = zmq.Socket.recv(sock, zmq.NOBLOCK)
        except zmq.Again:
            return None
        msg = Received(identity, [])
        if not sock.getsockopt(zmq.RCVMORE):
            return msg  # identity alone: decode() refuses it as empty
        first = zmq.Socket.recv(sock, zmq.NOBLOCK)
        msg.frames.append(first)
        sizes: list[int] = []
        try:
            msg.header = parse_header(first)
            if self.pool.slabs:  # sizes only matter where there is a pool to place frames in
                sizes = declared_frame_bytes(msg.header) or []
        except DecodeError:
            pass  # decode() will refuse it with this reason; its other frames are still drained below
        if sum(sizes) > self.max_message_bytes:
            sizes = []  # never reserve what the header merely claims; decode() refuses it as oversized
        while sock.getsockopt(zmq.RCVMORE):
            i = len(msg.frames) - 1
            size = sizes[i] if i < len(sizes) else 0
            region = None
            if size >= MIN_POOLED_FRAME:
                region = self.pool.take(size)
                self.misses += region is None
            if region is None:
                msg.frames.append(zmq.Socket.recv(sock, zmq.NOBLOCK, copy=False))
                continue
            got = zmq.Socket.recv_into(sock, region, flags=zmq.NOBLOCK)
            if got != size and msg.error is None:  # longer frames were cut at `size`: refuse, never guess
                msg.error = DecodeError("truncated", f"frame {i + 1} has {got} bytes, its header declares {size}")
            msg.frames.append(region)
        return msg
