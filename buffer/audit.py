"""The buffer's audit trail (turnstream/audit.py; on only with TURNSTREAM_AUDIT=1): acked chunk keys,
served and dropped episodes, served segments of open episodes.

Where a line sits relative to the write-ahead log decides what a `kill -9` can make it over- or
under-report:
- `ack` lines (status ok or duplicate) are written after the log commit, before the acks leave: a crash
  in between leaves a logged chunk without a line, but its actor never saw the ack, resends it and gets a
  `duplicate` line from the restarted buffer;
- `served`, `served_segment` and `dropped` lines are written before the log records the consumption or the drop: a crash
  in between over-reports (the episode is still held after the restart), it never hides a loss.
"""
from __future__ import annotations

import time
from pathlib import Path

from turnstream.core.audit import AuditLog, open_audit


class AckNotes:
    """Acks about to be sent; written only once the log holding their chunks is committed."""

    def __init__(self, audit: AuditLog):
        self.audit, self.pending = audit, []

    def note(self, msg, i: int, status: str) -> None:
        """Chunk `i` of the turn_chunks message `msg` is acked with `status`."""
        self.pending.append({"ack": status, "key": [msg.actor_id, msg.epoch, int(msg.seq[i])],
                             "ep": msg.episode_ids[i], "turn": int(msg.turn[i]), "done": bool(msg.done[i]),
                             "tokens": int(msg.obs_len[i] + msg.gen_len[i])})

    def flush(self) -> None:
        records, self.pending = self.pending, []
        self.audit.write(*records)


class AuditedJournal:
    """Passes every store event on to the real journal (or none), writing served/dropped lines first.

    The server commits through it too: `commit` makes the log durable, then writes the ack lines noted
    since the last commit, so an `ack` line never names a chunk the log could still lose to `kill -9`.
    """

    def __init__(self, inner, audit: AuditLog, acks: AckNotes):
        self.inner, self.audit, self.acks = inner, audit, acks

    def __getattr__(self, name):  # wal, maybe_compact, ...: the real journal's
        return getattr(self.inner, name)

    def chunks(self, frames: list) -> None:
        if self.inner is not None:
            self.inner.chunks(frames)

    def consumed(self, episode_ids: list[str]) -> None:
        self.audit.write({"served": list(episode_ids), "time": time.time()})
        if self.inner is not None:
            self.inner.consumed(episode_ids)

    def segment(self, episode_id: str, first: int, end: int) -> None:
        self.audit.write({"served_segment": episode_id, "turns": [first, end], "time": time.time()})
        if self.inner is not None:
            self.inner.segment(episode_id, first, end)

    def closed(self, episode_ids: list[str], reason: str) -> None:
        self.audit.write({"dropped": list(episode_ids), "reason": reason})
        if self.inner is not None:
            self.inner.closed(episode_ids, reason)

    def version(self, version: int) -> None:
        if self.inner is not None:
            self.inner.version(version)

    def commit(self) -> None:
        if self.inner is not None:
            self.inner.commit()
        self.acks.flush()

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()
        self.audit.close()


def attach_audit(run_dir: str | Path, store, journal):
    """With TURNSTREAM_AUDIT=1: audit `store` and return the journal the server should commit through.

    Otherwise returns `journal` unchanged. Call after the log was replayed (replay is not new traffic).
    """
    audit = open_audit(run_dir, "buffer")
    if audit is None:
        return journal
    acks = AckNotes(audit)
    audited = AuditedJournal(journal, audit, acks)
    store.journal = audited
    ingest_message = store.ingest_message

    def ingest_and_note(identity, msg, *args, **kwargs):
        entries = ingest_message(identity, msg, *args, **kwargs)
        for i, (_seq, status, _reason) in enumerate(entries):
            if status in ("ok", "duplicate"):  # only a batch that unpacked has these, one entry per chunk
                acks.note(msg, i, status)
        if journal is None:  # no log to commit first: the acks leave right after this
            acks.flush()
        return entries

    store.ingest_message = ingest_and_note  # this store only; ReplayStore itself stays as it is
    return audited if journal is not None else None
