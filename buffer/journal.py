"""The replay store's write-ahead journal: what goes in the log, how a restart replays it, compaction.

Record kinds:
- CHUNK:    an ingested message (turn chunks), stored as the wire frames it arrived in (replayed through
            ReplayStore.ingest_message, which rebuilds episodes, dedup watermarks and counters exactly as
            the first time, rejecting and skipping the same chunks);
- LIVE:     the chunks of an episode still held, written by compaction (restored without counting them again);
- EVENT:    msgpack {"e": "consumed" | "segment" | "closed" | "version", ...}: an episode served, a segment
            of an open episode served (its turns [first, end)), an episode dropped (stale/abandoned) or
            a new learner version;
- SNAPSHOT: msgpack of the counters a compaction folds in (dedup watermarks, closed episode ids,
            learner version, accepted count, rate-limiter counters).
Because "consumed" is logged (and committed) before a batch is sent, a restarted buffer never serves an
episode twice; an episode consumed just before a crash whose batch never left is lost to the learner
(at-most-once consumption; the learner simply asks again).
"""
from __future__ import annotations

import struct
from collections import OrderedDict
from pathlib import Path

import msgpack

from turnstream.buffer.dedup import SeqDeduper
from turnstream.buffer.metrics import BufferMetrics
from turnstream.buffer.store import ReplayStore
from turnstream.buffer.wal import WalFile, WalWriter
from turnstream.protocol.codec import DecodeError, decode, encode
from turnstream.protocol.chunk_batch import pack, unpack
from turnstream.protocol.messages import TurnChunkBatch

CHUNK, LIVE, EVENT, SNAPSHOT = 1, 2, 3, 4


class WalJournal:
    def __init__(self, wal: WalFile, metrics: BufferMetrics, *, compact_bytes: int):
        self.wal, self.m = wal, metrics
        self.compact_bytes = compact_bytes
        self.compact_at = compact_bytes

    # ---- the Journal protocol used by ReplayStore -----------------------------------------------
    def chunks(self, frames: list) -> None:
        self._append(CHUNK, _frame_parts(frames))

    def consumed(self, episode_ids: list[str]) -> None:
        self._append(EVENT, [msgpack.packb({"e": "consumed", "ids": episode_ids})])

    def segment(self, episode_id: str, first: int, end: int) -> None:
        self._append(EVENT, [msgpack.packb({"e": "segment", "id": episode_id, "first": first, "end": end})])

    def closed(self, episode_ids: list[str], reason: str) -> None:
        self._append(EVENT, [msgpack.packb({"e": "closed", "ids": episode_ids, "reason": reason})])

    def version(self, version: int) -> None:
        self._append(EVENT, [msgpack.packb({"e": "version", "v": version})])

    def commit(self) -> None:
        """Durable per the fsync policy; the server calls this before it acks or sends a batch."""
        if self.wal.dirty and self.wal.policy == "always":
            self.m.wal_fsyncs.inc()
        self.wal.commit()

    def _append(self, kind: int, parts: list) -> None:
        n = self.wal.append(kind, parts)
        self.m.wal_appended.inc(n)

    # ---- restart and compaction -------------------------------------------------------------------
    def replay(self, store: ReplayStore) -> int:
        """Rebuild `store` from the log; returns the number of records replayed."""
        real_metrics, store.m, store.journal = store.m, BufferMetrics(), None  # replay is not new traffic
        count = 0
        try:
            for kind, payload in self.wal.records():
                count += 1
                if kind == SNAPSHOT:
                    _apply_snapshot(store, msgpack.unpackb(payload, raw=False, strict_map_key=False))
                elif kind == CHUNK:
                    store.ingest_message(b"", _decode_chunks(payload))
                elif kind == LIVE:
                    for chunk in unpack(_decode_chunks(payload)):
                        store.restore_chunk(chunk)
                elif kind == EVENT:
                    _apply_event(store, msgpack.unpackb(payload, raw=False))
        finally:
            store.m, store.journal = real_metrics, self
        self.m.wal_replayed.inc(count)
        self.m.wal_torn.inc(self.wal.torn_bytes)
        self.m.wal_bytes.set(self.wal.size)
        return count

    def maybe_compact(self, store: ReplayStore) -> bool:
        if self.wal.size < self.compact_at:
            return False
        self.compact(store)
        return True

    def compact(self, store: ReplayStore) -> None:
        """Rewrite the log as one snapshot plus the chunks of episodes still held; swap it in atomically."""
        tmp = Path(str(self.wal.path) + ".compact")
        writer = WalWriter(tmp)
        writer.append(SNAPSHOT, [msgpack.packb(_snapshot(store))])
        for ep in [*store.in_progress.values(), *store.ready.values()]:
            writer.append(LIVE, _frame_parts(encode(pack([ep.turns[turn] for turn in sorted(ep.turns)]))))
            if ep.served:  # its first turns were trained in segments
                writer.append(EVENT, [msgpack.packb({"e": "segment", "id": ep.episode_id, "first": 0,
                                                     "end": ep.served})])
        writer.finish()
        self.wal.replace_with(tmp)
        # a log that is mostly live data is not worth rewriting again soon
        self.compact_at = max(self.compact_bytes, 2 * self.wal.size)
        self.m.wal_compactions.inc()
        self.m.wal_bytes.set(self.wal.size)

    def close(self) -> None:
        self.wal.close()


def _frame_parts(frames: list) -> list:
    views = [memoryview(f.buffer if hasattr(f, "buffer") else f) for f in frames]
    head = struct.pack(f"<{len(views) + 1}I", len(views), *(v.nbytes for v in views))
    return [head, *views]


def _decode_chunks(payload: memoryview) -> TurnChunkBatch:
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


def _snapshot(store: ReplayStore) -> dict:
    return {"learner_version": store.learner_version, "accepted": store.admission.accepted,
            "inserts": store.limiter.inserts, "samples": store.limiter.samples,
            "max_served_staleness": store.max_served_staleness, "dropped_since_batch": store.dropped_since_batch,
            "dedup": store.dedup.snapshot(), "closed": list(store.closed)}


def _apply_snapshot(store: ReplayStore, snap: dict) -> None:
    store.in_progress.clear()
    store.ready.clear()
    store.learner_version = int(snap["learner_version"])
    store.admission.accepted = int(snap["accepted"])
    store.limiter.inserts, store.limiter.samples = int(snap["inserts"]), int(snap["samples"])
    store.max_served_staleness = int(snap["max_served_staleness"])
    store.dropped_since_batch = int(snap["dropped_since_batch"])
    store.dedup = SeqDeduper.restore(snap["dedup"])
    store.closed = OrderedDict.fromkeys(snap["closed"])


def _apply_event(store: ReplayStore, event: dict) -> None:
    kind = event.get("e")
    if kind == "consumed":
        store.mark_consumed(list(event["ids"]))
    elif kind == "segment":
        store.mark_segment_served(str(event["id"]), int(event["end"]))
    elif kind == "closed":
        store.drop(list(event["ids"]), str(event["reason"]))
    elif kind == "version":
        store.set_learner_version(int(event["v"]))
