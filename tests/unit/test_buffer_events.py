"""buffer.events: what the replay store tells its listeners (journal, metrics, audit), in which order."""
from __future__ import annotations

import json

from turnstream.buffer.audit import open_buffer_audit
from turnstream.buffer.durability.journal import WalJournal
from turnstream.buffer.durability.wal import WalFile
from turnstream.buffer.store.events import (BatchServed, ChunkAccepted, ChunkDuplicate, ChunkRejected, ChunksArrived,
                                      EpisodeCompleted, EpisodesDropped, EpisodeStarted, VersionAdvanced)
from turnstream.core.audit import ENV_VAR
from tests.unit.test_store import ID, chunk, ingest, make_store, metrics_of


class Recorder:
    def __init__(self):
        self.events = []

    def on_event(self, event) -> None:
        self.events.append(event)

    def kinds(self) -> list[str]:
        return [type(e).__name__ for e in self.events]


def test_a_chunk_is_announced_before_it_takes_effect_and_a_resend_only_as_a_duplicate():
    store, heard = make_store(batch_episodes=1), Recorder()
    store.listeners.add(heard)
    ingest(store, ID, chunk(seq=0, done=True))
    assert [type(e) for e in heard.events] == [ChunksArrived, ChunkAccepted, EpisodeStarted, EpisodeCompleted]
    assert heard.events[2].used_credit is False  # no credit was granted to this actor
    heard.events.clear()
    ingest(store, ID, chunk(seq=0, done=True))  # a resend: nothing for the log
    ingest(store, ID, chunk(seq=1, turn=1))  # a turn after the episode closed
    assert heard.kinds() == ["ChunkDuplicate", "ChunksArrived", "ChunkRejected"]
    assert isinstance(heard.events[0], ChunkDuplicate) and heard.events[2].reason == "episode_closed"
    assert isinstance(heard.events[2], ChunkRejected)


def test_serving_and_dropping_are_announced_with_what_the_journal_and_metrics_need():
    store, heard = make_store(batch_episodes=1, eta=1, max_staleness=1), Recorder()
    store.listeners.add(heard)
    ingest(store, ID, chunk(seq=0, ep="a", done=True, versions=0))
    ingest(store, ID, chunk(seq=1, ep="b", done=True, versions=1))
    heard.events.clear()
    batch, dropped = store.take_batch(2, 1)
    assert [type(e) for e in heard.events] == [VersionAdvanced, EpisodesDropped, BatchServed]
    assert heard.events[1].episode_ids == ["a"] and heard.events[1].reason == "stale"
    served = heard.events[2]
    assert served.episode_ids == ["b"] and served.staleness == [1] and served.max_served_staleness == 1
    assert [e.episode_id for e in batch] == ["b"] and dropped == 1


def test_replay_is_heard_by_no_listener(tmp_path):
    store = make_store()
    journal = WalJournal(WalFile(tmp_path / "wal.log"), metrics_of(store), compact_bytes=1 << 20)
    store.listeners.add(journal)
    ingest(store, ID, chunk(seq=0, done=True))
    journal.close()
    again, heard = make_store(), Recorder()
    again.listeners.add(heard)
    WalJournal(WalFile(tmp_path / "wal.log"), metrics_of(again), compact_bytes=1 << 20).replay(again)
    assert list(again.ready) == ["e0"] and heard.events == []
    assert not metrics_of(again).registry.get_sample_value("turnstream_buffer_episodes_total", {"event": "completed"})


def test_audit_lines_ack_only_after_the_commit_and_drops_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, "1")
    store, audit = make_store(episode_timeout_s=1.0), open_buffer_audit(tmp_path)
    store.listeners.add(audit)
    ingest(store, ID, chunk(seq=0, ep="half"))
    ingest(store, ID, chunk(seq=0, ep="half"))
    store.expire(store.in_progress["half"].last_seen + 2)

    def lines():
        return [json.loads(line) for line in (tmp_path / "audit" / "buffer.jsonl").read_text().splitlines()]

    assert [rec.get("dropped") for rec in lines()[1:]] == [["half"]]  # the acks wait for the log commit
    audit.committed()
    assert [rec.get("ack") for rec in lines()[2:]] == ["ok", "duplicate"]
    assert lines()[2]["key"] == ["a0", 0, 0] and lines()[2]["tokens"] == 5
    audit.close()
