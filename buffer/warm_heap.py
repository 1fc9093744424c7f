"""Keep the frames the buffer receives in memory that is already faulted in, without copying them.

Why: a buffer keeps what it receives, and libzmq allocates every frame afresh. By default glibc serves a
1 MB allocation with a fresh mmap (or with heap it has just given back to the kernel), so every kept
megabyte first takes about 256 page faults in libzmq's I/O thread. At 1 MB per chunk that costs about
twice the receive itself (`turnstream bench dataplane`: raw_keep against raw).

`reserve_warm_heap(nbytes)` sets glibc's malloc so that those allocations come from heap memory touched
once at start-up and kept mapped afterwards:
- M_ARENA_MAX = 1: libzmq's I/O thread allocates from the main heap, where the reserve lies (a thread's
  own arena would start cold). Must run before the first ZeroMQ socket starts that thread.
- M_MMAP_THRESHOLD = 32 MiB (glibc's largest): frames up to that size come from the heap, not from mmap.
- M_TRIM_THRESHOLD = nbytes + 64 MiB: that much freed memory stays mapped instead of going back to the
  kernel (glibc trims once the free top of the heap reaches the threshold, so it must exceed the reserve).
- then `nbytes` are allocated in 16 MiB blocks, written once and freed: the heap now holds them, warm.

Frames are then kept as libzmq received them; the decoded arrays are views into them. When a chunk is
trained or dropped its frames go back to the heap, warm, for the next ones, so a buffer in steady state
takes no page faults after its peak. The reserve only needs to cover the growth to that peak.

This replaced a pool of pre-faulted slabs that every large frame was copied into (`recv_into`): the copy
cost the buffer's main thread about 130 µs per megabyte, more than all the rest of keeping a chunk.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("turnstream.buffer")

# glibc mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's largest on 64-bit
TRIM_SLACK_BYTES = 64 * 1024 * 1024
MAX_RESERVE_BYTES = 2**31 - 1 - TRIM_SLACK_BYTES  # mallopt takes a C int
BLOCK_BYTES = 16 * 1024 * 1024


def reserve_warm_heap(nbytes: int) -> bool:
    """Set glibc's malloc as described above and fault in `nbytes` (at most MAX_RESERVE_BYTES) of heap.

    Process-wide, so the buffer's entry point calls it once, before it opens sockets. Returns whether it
    took effect: False off glibc, where it is a no-op."""
    if not 0 < nbytes <= MAX_RESERVE_BYTES:
        raise ValueError(f"reserve must be in 1..{MAX_RESERVE_BYTES} bytes, got {nbytes}")
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt, malloc, free = libc.mallopt, libc.malloc, libc.free
    except (OSError, AttributeError, TypeError):
        return False
    malloc.restype, free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    settings = ((M_ARENA_MAX, 1), (M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
                (M_TRIM_THRESHOLD, nbytes + TRIM_SLACK_BYTES))
    if not all(mallopt(param, value) for param, value in settings):
        return False
    blocks = []
    for _ in range(-(-nbytes // BLOCK_BYTES)):
        block = malloc(BLOCK_BYTES)
        if not block:
            log.warning("buffer: the warm heap reserve got %d of %d bytes", len(blocks) * BLOCK_BYTES, nbytes)
            break
        ctypes.memset(block, 0, BLOCK_BYTES)
        blocks.append(block)
    for block in blocks:
        free(block)
    return True
