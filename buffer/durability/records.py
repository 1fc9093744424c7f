"""The records of the buffer's write-ahead log, in bytes (the file's framing is wal.py's).

Kinds:
- CHUNK:    an ingested message (turn chunks), stored as the wire frames it arrived in (replayed through
            ReplayStore.ingest_message, which rebuilds episodes, dedup watermarks and counters exactly as
            the first time, rejecting and skipping the same chunks);
- LIVE:     the chunks of an episode still held, written by compaction (restored without counting them again);
- EVENT:    msgpack {"e": "consumed" | "segment" | "closed" | "version", ...}: an episode served, a segment
            of an open episode served or its stale turns skipped (its turns [first, end)), an episode dropped
            (stale/abandoned/...) or a new learner version;
- SNAPSHOT: msgpack of what a compaction folds in (buffer.store.StoreSnapshot: dedup watermarks, closed
            episode ids, learner version, accepted count, rate-limiter counters).
"""
from __future__ import annotations

import struct

import msgpack

from turnstream.buffer.store.replay_store import StoreSnapshot
from turnstream.protocol.codec import DecodeError, decode
from turnstream.protocol.messages import TurnChunkBatch

CHUNK, LIVE, EVENT, SNAPSHOT = 1, 2, 3, 4


def frame_parts(frames: list) -> list:
    """A CHUNK or LIVE record's parts: a header of frame sizes, then the frames themselves (not copied)."""
    views = [memoryview(f) for f in frames]
    head = struct.pack(f"<{len(views) + 1}I", len(views), *(v.nbytes for v in views))
    return [head, *views]


def decode_chunks(payload: memoryview) -> TurnChunkBatch:
    (n,) = struct.unpack_from("<I", payload, 0)
    sizes = struct.unpack_from(f"<{n}I", payload, 4)
    pos, frames = 4 + 4 * n, []
    for size in sizes:
        frames.append(bytes(payload[pos:pos + size]))  # own copy: do not pin the whole log file in memory
        pos += size
    msg = decode(frames)
    if not isinstance(msg, TurnChunkBatch):
        raise DecodeError("unexpected_type", "write-ahead log chunk record")
    return msg


def consumed(episode_ids: list[str]) -> bytes:
    return msgpack.packb({"e": "consumed", "ids": episode_ids})


def segment(episode_id: str, first: int, end: int) -> bytes:
    return msgpack.packb({"e": "segment", "id": episode_id, "first": first, "end": end})


def closed(episode_ids: list[str], reason: str) -> bytes:
    return msgpack.packb({"e": "closed", "ids": episode_ids, "reason": reason})


def version(v: int) -> bytes:
    return msgpack.packb({"e": "version", "v": v})


def read_event(payload: memoryview) -> dict:
    return msgpack.unpackb(payload, raw=False)


def snapshot(snap: StoreSnapshot) -> bytes:
    return msgpack.packb({"learner_version": snap.learner_version, "accepted": snap.accepted,
                          "inserts": snap.inserts, "samples": snap.samples,
                          "max_served_staleness": snap.max_served_staleness,
                          "dropped_since_batch": snap.dropped_since_batch, "dedup": snap.dedup, "closed": snap.closed})


def read_snapshot(payload: memoryview) -> StoreSnapshot:
    snap = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    return StoreSnapshot(learner_version=int(snap["learner_version"]), accepted=int(snap["accepted"]),
                         inserts=int(snap["inserts"]), samples=int(snap["samples"]),
                         max_served_staleness=int(snap["max_served_staleness"]),
                         dropped_since_batch=int(snap["dropped_since_batch"]), dedup=snap["dedup"],
                         closed=snap["closed"])
