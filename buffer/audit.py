"""The buffer's audit trail (core/audit.py; on only with TURNSTREAM_AUDIT=1): acked chunk keys,
served and dropped episodes, served segments of open episodes. A store listener (buffer/store/events.py),
attached after the log was replayed (replay is not new traffic) and ahead of the journal.

Where a line sits relative to the write-ahead log decides what a `kill -9` can make it over- or
under-report:
- `ack` lines (status ok or duplicate) are held until the server commits the log, and written before the
  acks leave: a crash in between leaves a logged chunk without a line, but its actor never saw the ack,
  resends it and gets a `duplicate` line from the restarted buffer;
- `replayed` lines (buffer.positive_replay) name the served episodes a batch held again and those it kept to
  serve again, `critic_replayed` lines (buffer.critic_replay) those it held for the critic alone; they consume
  nothing, so a checker counts `served` lines for what left the store;
- `served`, `served_segment` and `dropped` lines are written as the store announces the change, before the
  journal (attached after this listener) records the consumption or the drop: a crash in between
  over-reports (the episode is still held after the restart), it never hides a loss. Stale turns the store
  skips are `served_segment` lines too, marked `"stale": true`: they leave the store as a served segment's
  turns do, but as many as were stale, where a served segment holds at least `buffer.segment_turns`.
"""
from __future__ import annotations

import time
from pathlib import Path

from turnstream.buffer.store.events import (BatchServed, ChunkAccepted, ChunkDuplicate, EpisodesDropped, StoreEvent,
                                      TurnsSkipped)
from turnstream.core.audit import AuditLog, open_audit
from turnstream.protocol.messages import TurnChunk


class BufferAudit:
    def __init__(self, audit: AuditLog):
        self.audit = audit
        self.pending_acks: list[dict] = []  # acks about to be sent, written once the log holding them is committed

    def on_event(self, event: StoreEvent) -> None:
        match event:
            case ChunkAccepted(chunk=chunk):
                self._note_ack(chunk, "ok")
            case ChunkDuplicate(chunk=chunk):
                self._note_ack(chunk, "duplicate")
            case BatchServed():
                self.audit.write({"served": event.episode_ids, "time": time.time()})
                if event.replays or event.kept_for_replay:  # served again, never consumed twice
                    self.audit.write({"replayed": [r.episode_id for r in event.replays],
                                      "kept_for_replay": event.kept_for_replay, "time": time.time()})
                if event.for_critic:
                    self.audit.write({"critic_replayed": [r.episode_id for r in event.for_critic],
                                      "staleness": event.critic_staleness, "time": time.time()})
                for seg in event.segments:
                    self._served_segment(seg.episode_id, seg.first, seg.end)
            case TurnsSkipped(episode_id=episode_id, first=first, end=end):
                self._served_segment(episode_id, first, end, stale=True)
            case EpisodesDropped(episode_ids=ids, reason=reason):
                self.audit.write({"dropped": list(ids), "reason": reason})

    def _note_ack(self, chunk: TurnChunk, status: str) -> None:
        self.pending_acks.append({"ack": status, "key": [chunk.actor_id, chunk.epoch, int(chunk.seq)],
                                  "ep": chunk.episode_id, "turn": int(chunk.turn), "done": bool(chunk.done),
                                  "tokens": int(chunk.obs_tokens.size + chunk.gen_tokens.size)})

    def _served_segment(self, episode_id: str, first: int, end: int, stale: bool = False) -> None:
        self.audit.write({"served_segment": episode_id, "turns": [first, end], "time": time.time(),
                          **({"stale": True} if stale else {})})

    def committed(self) -> None:
        """The log holding the noted acks' chunks is committed (or there is none), and the acks are leaving."""
        records, self.pending_acks = self.pending_acks, []
        self.audit.write(*records)

    def close(self) -> None:
        self.audit.close()


def open_buffer_audit(run_dir: str | Path) -> BufferAudit | None:
    """With TURNSTREAM_AUDIT=1, the buffer's audit trail under `run_dir`; else None."""
    audit = open_audit(run_dir, "buffer")
    return BufferAudit(audit) if audit is not None else None
