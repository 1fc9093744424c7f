"""Append-only write-ahead log file: framed, checksummed records; a torn tail is cut off on open.

Record layout (little endian): u32 body length, u32 crc32 of the body, then the body. The body is
u8 kind followed by kind-specific bytes (buffer/durability/records.py defines the kinds). Writes go straight to the
file descriptor with os.writev (no user-space buffer), so a record whose append returned survives
`kill -9` of the process under every fsync policy; only a machine crash can lose what was not fsynced:

- "always":   fsync before the buffer acks (group commit: one fsync per drained batch of messages);
- "interval": fsync at most every `fsync_interval_s`; a machine crash loses at most that window;
- "never":    the kernel decides when to write back.
"""
from __future__ import annotations

import os
import struct
import time
import zlib
from pathlib import Path
from typing import Iterator, Sequence

from turnstream.core.fsutil import fsync_dir

_HEAD = struct.Struct("<II")
MAX_RECORD_BYTES = 1 << 31
FSYNC_POLICIES = ("always", "interval", "never")


class WalFile:
    def __init__(self, path: Path, *, fsync: str = "always", fsync_interval_s: float = 0.05):
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync policy must be one of {FSYNC_POLICIES}, got {fsync!r}")
        self.path, self.policy, self.fsync_interval_s = Path(path), fsync, fsync_interval_s
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self.size = os.fstat(self.fd).st_size
        self.dirty = False
        self.last_sync = time.monotonic()
        self.torn_bytes = 0  # bytes cut off the tail at open (a record being written when the process died)

    # ---- reading ---------------------------------------------------------------------------------
    def records(self) -> Iterator[tuple[int, memoryview]]:
        """Yield (kind, payload) of every intact record, then cut off anything after the last one."""
        with open(self.path, "rb") as f:
            data = f.read()
        view, pos = memoryview(data), 0
        while pos + _HEAD.size <= len(data):
            length, crc = _HEAD.unpack_from(data, pos)
            end = pos + _HEAD.size + length
            if length < 1 or end > len(data):
                break
            body = view[pos + _HEAD.size:end]
            if zlib.crc32(body) != crc:
                break
            yield body[0], body[1:]
            pos = end
        if pos < len(data):
            self.torn_bytes = len(data) - pos
            os.ftruncate(self.fd, pos)
            os.fsync(self.fd)
            self.size = pos

    # ---- writing ---------------------------------------------------------------------------------
    def append(self, kind: int, parts: Sequence[bytes | memoryview]) -> int:
        """Append one record made of `parts` (no copy of large parts); returns its size in bytes."""
        kind_b = bytes((kind,))
        length = 1 + sum(memoryview(p).nbytes for p in parts)
        if length >= MAX_RECORD_BYTES:
            raise ValueError("record too large for the write-ahead log")
        crc = zlib.crc32(kind_b)
        for p in parts:
            crc = zlib.crc32(p, crc)
        _write_all(self.fd, [_HEAD.pack(length, crc), kind_b, *parts])
        self.size += _HEAD.size + length
        self.dirty = True
        return _HEAD.size + length

    def commit(self) -> None:
        """Make appended records as durable as the policy promises; call before acking them."""
        if self.policy == "always":
            self.sync()
        elif self.policy == "interval" and time.monotonic() - self.last_sync >= self.fsync_interval_s:
            self.sync()

    def sync(self) -> None:
        if self.dirty:
            os.fsync(self.fd)
            self.dirty = False
        self.last_sync = time.monotonic()

    def replace_with(self, tmp: Path) -> None:
        """Atomically swap in a compacted file written (and fsynced) at `tmp`."""
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)
        os.close(self.fd)
        self.fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        self.size = os.fstat(self.fd).st_size
        self.dirty = False

    def close(self) -> None:
        if self.fd >= 0:
            self.sync()
            os.close(self.fd)
            self.fd = -1


class WalWriter:
    """Writes a fresh log (used for compaction): same framing, then fsync and close."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def append(self, kind: int, parts: Sequence[bytes | memoryview]) -> None:
        kind_b = bytes((kind,))
        length = 1 + sum(memoryview(p).nbytes for p in parts)
        crc = zlib.crc32(kind_b)
        for p in parts:
            crc = zlib.crc32(p, crc)
        _write_all(self.fd, [_HEAD.pack(length, crc), kind_b, *parts])

    def finish(self) -> None:
        os.fsync(self.fd)
        os.close(self.fd)


def _write_all(fd: int, parts: list) -> None:
    views = [v for v in (memoryview(p).cast("B") for p in parts) if v.nbytes]  # empty arrays: no bytes
    while views:
        n = os.writev(fd, views[:512])  # IOV_MAX is at least 1024 on Linux
        while n and views:  # a short write: drop what went out, keep the rest
            if n >= views[0].nbytes:
                n -= views[0].nbytes
                views.pop(0)
            else:
                views[0] = views[0][n:]
                n = 0
