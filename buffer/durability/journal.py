"""The replay store's write-ahead journal: a store listener that logs every state change before it takes
effect, the replay that rebuilds a restarted store from the log, and compaction (records: records.py).

Because "consumed" is logged (and committed) before a batch is sent, a restarted buffer never serves an
episode twice; an episode consumed just before a crash whose batch never left is lost to the learner
(at-most-once consumption; the learner simply asks again).
"""
from __future__ import annotations

from pathlib import Path

from turnstream.buffer.durability import records
from turnstream.buffer.durability.records import CHUNK, EVENT, LIVE, SNAPSHOT
from turnstream.buffer.durability.wal import WalFile, WalWriter
from turnstream.buffer.store.events import (BatchServed, ChunksArrived, EpisodesDropped, StoreEvent, TurnsSkipped,
                                      VersionAdvanced)
from turnstream.buffer.metrics import BufferMetrics
from turnstream.buffer.store.replay_store import ReplayStore
from turnstream.protocol.chunk_batch import pack, unpack
from turnstream.protocol.codec import encode


class WalJournal:
    def __init__(self, wal: WalFile, metrics: BufferMetrics, *, compact_bytes: int):
        self.wal, self.m = wal, metrics
        self.compact_bytes = compact_bytes
        self.compact_at = compact_bytes

    # ---- a store listener (buffer/store/events.py) -------------------------------------------------------
    def on_event(self, event: StoreEvent) -> None:
        match event:
            case ChunksArrived(message=msg, frames=frames):
                self._append(CHUNK, records.frame_parts(frames if frames is not None else encode(msg)))
            case BatchServed():
                self._append(EVENT, [records.consumed(event.episode_ids)])
                for seg in event.segments:
                    self._append(EVENT, [records.segment(seg.episode_id, seg.first, seg.end)])
            case TurnsSkipped(episode_id=episode_id, first=first, end=end):
                self._append(EVENT, [records.segment(episode_id, first, end)])
            case EpisodesDropped(episode_ids=ids, reason=reason):
                self._append(EVENT, [records.closed(ids, reason)])
            case VersionAdvanced(version=version):
                self._append(EVENT, [records.version(version)])

    def _append(self, kind: int, parts: list) -> None:
        n = self.wal.append(kind, parts)
        self.m.wal_appended.inc(n)

    def commit(self) -> None:
        """Durable per the fsync policy; the server calls this before it acks or sends a batch."""
        if self.wal.dirty and self.wal.policy == "always":
            self.m.wal_fsyncs.inc()
        self.wal.commit()

    def housekeeping(self, store: ReplayStore) -> None:
        """Between messages: compact when the log has grown enough, and sync what the "interval" fsync policy
        still owes when traffic stops."""
        if self.wal.size >= self.compact_at:
            self.compact(store)
        self.wal.commit()
        self.m.wal_bytes.set(self.wal.size)

    # ---- restart and compaction -------------------------------------------------------------------
    def replay(self, store: ReplayStore) -> int:
        """Rebuild `store` from the log; returns the number of records replayed. Replay is not new traffic:
        the store's listeners hear none of it."""
        count = 0
        with store.listeners.muted():
            for kind, payload in self.wal.records():
                count += 1
                if kind == SNAPSHOT:
                    store.restore(records.read_snapshot(payload))
                elif kind == CHUNK:
                    store.ingest_message(b"", records.decode_chunks(payload))
                elif kind == LIVE:
                    for chunk in unpack(records.decode_chunks(payload)):
                        store.restore_chunk(chunk)
                elif kind == EVENT:
                    _apply_event(store, records.read_event(payload))
        self.m.wal_replayed.inc(count)
        self.m.wal_torn.inc(self.wal.torn_bytes)
        self.m.wal_bytes.set(self.wal.size)
        return count

    def compact(self, store: ReplayStore) -> None:
        """Rewrite the log as one snapshot plus the chunks of episodes still held; swap it in atomically."""
        tmp = Path(str(self.wal.path) + ".compact")
        writer = WalWriter(tmp)
        writer.append(SNAPSHOT, [records.snapshot(store.snapshot())])
        for ep in [*store.in_progress.values(), *store.ready.values()]:
            writer.append(LIVE, records.frame_parts(encode(pack([ep.turns[turn] for turn in sorted(ep.turns)]))))
            if ep.served:  # its first turns were trained in segments
                writer.append(EVENT, [records.segment(ep.episode_id, 0, ep.served)])
        writer.finish()
        self.wal.replace_with(tmp)
        # a log that is mostly live data is not worth rewriting again soon
        self.compact_at = max(self.compact_bytes, 2 * self.wal.size)
        self.m.wal_compactions.inc()
        self.m.wal_bytes.set(self.wal.size)

    def close(self) -> None:
        self.wal.close()


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
