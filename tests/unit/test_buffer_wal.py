"""buffer.durability (wal, journal): framing, torn tails, replay rebuilding the store, compaction."""
from __future__ import annotations

import os

import numpy as np
import pytest

from turnstream.buffer.durability.journal import WalJournal
from turnstream.buffer.durability.records import CHUNK
from turnstream.buffer.durability.wal import WalFile
from turnstream.protocol.chunk_batch import pack
from turnstream.protocol.codec import encode
from tests.unit.test_store import ID, chunk, ingest, make_store, metrics_of


def open_store(path, fsync="always", **kw):
    store = make_store(**kw)
    journal = WalJournal(WalFile(path, fsync=fsync), metrics_of(store), compact_bytes=1 << 20)
    journal.replay(store)
    store.listeners.add(journal)
    return store, journal


def ingest_logged(store, journal, c):
    msg = pack([c])
    (_seq, status, reason), = store.ingest_message(ID, msg, encode(msg))
    journal.commit()
    return status, reason


def restarted(path, store, journal, **kw):
    """The store a buffer restarted on `path` rebuilds (its journal closed), after checking it holds the state
    `store` had when its journal closed."""
    before = state(store)
    journal.close()
    again, journal2 = open_store(path, **kw)
    journal2.close()
    assert state(again) == before
    return again


def state(store):
    return (sorted(store.ready), sorted(store.in_progress), store.admission.accepted, store.learner_version,
            store.limiter.inserts, store.limiter.samples,
            {k: (len(e.turns), e.num_tokens) for k, e in {**store.in_progress, **store.ready}.items()})


def test_records_round_trip_and_empty_parts(tmp_path):
    wal = WalFile(tmp_path / "w.log")
    wal.append(7, [b"abc", b"", memoryview(b"de")])
    wal.append(8, [])
    wal.close()
    assert [(k, bytes(p)) for k, p in WalFile(tmp_path / "w.log").records()] == [(7, b"abcde"), (8, b"")]


@pytest.mark.parametrize("cut", [1, 4, 8, 9, 12])
def test_torn_tail_is_cut_off_and_later_appends_are_readable(tmp_path, cut):
    path = tmp_path / "w.log"
    wal = WalFile(path)
    wal.append(1, [b"first"])
    wal.append(1, [b"second record"])
    wal.close()
    os.truncate(path, path.stat().st_size - cut)  # the process died while writing the second record
    wal = WalFile(path)
    assert [bytes(p) for _, p in wal.records()] == [b"first"]
    assert wal.torn_bytes > 0
    wal.append(1, [b"third"])
    wal.close()
    assert [bytes(p) for _, p in WalFile(path).records()] == [b"first", b"third"]


def test_corrupt_record_stops_replay_there(tmp_path):
    path = tmp_path / "w.log"
    wal = WalFile(path)
    for body in (b"one", b"two", b"three"):
        wal.append(1, [body])
    wal.close()
    data = bytearray(path.read_bytes())
    data[len(data) - 2] ^= 0xFF  # flip a byte of the last record: its crc no longer matches
    path.write_bytes(bytes(data))
    assert [bytes(p) for _, p in WalFile(path).records()] == [b"one", b"two"]


def test_unknown_fsync_policy_is_refused(tmp_path):
    with pytest.raises(ValueError, match="fsync policy"):
        WalFile(tmp_path / "w.log", fsync="sometimes")


@pytest.mark.parametrize("fsync", ["always", "interval", "never"])
def test_replay_rebuilds_episodes_dedup_and_consumption(tmp_path, fsync):
    path = tmp_path / "wal.log"
    store, journal = open_store(path, fsync=fsync, eta=4, max_staleness=4)
    seq = 0
    for ep in ("a", "b", "c"):
        ingest_logged(store, journal, chunk(seq=seq, ep=ep, prompt=f"p{ep}"))
        ingest_logged(store, journal, chunk(seq=seq + 1, ep=ep, turn=1, obs=(9,), done=True))
        seq += 2
    ingest_logged(store, journal, chunk(seq=seq, ep="open"))
    store.set_learner_version(1)
    episodes, _ = store.take_batch(1, 2)
    assert [e.episode_id for e in episodes] == ["a", "b"]
    before = state(store)
    journal.close()  # what kill -9 leaves behind is the same file: writes are unbuffered

    again, journal2 = open_store(path, eta=4, max_staleness=4)
    assert state(again) == before
    assert list(again.ready) == ["c"] and list(again.in_progress) == ["open"]
    # resends of anything acked before the restart are duplicates, consumed episodes stay closed
    assert ingest(again, ID, chunk(seq=0, ep="a")) == ("duplicate", "")
    assert ingest(again, ID, chunk(seq=99, ep="a", turn=2, obs=(1,))) == ("rejected", "episode_closed")
    got, _ = again.take_batch(1, 1)
    assert [e.episode_id for e in got] == ["c"]
    assert again.take_batch(1, 1) is None
    journal2.close()


def test_drops_and_expiry_are_replayed(tmp_path):
    path = tmp_path / "wal.log"
    store, journal = open_store(path, max_staleness=1, eta=1)
    ingest_logged(store, journal, chunk(seq=0, ep="old", done=True, versions=0))
    ingest_logged(store, journal, chunk(seq=1, ep="idle"))
    store.set_learner_version(2)  # "old" is now stale: dropped and counted
    store.expire(now=10**9)  # "idle" was abandoned
    before = state(store)
    journal.close()
    again, journal2 = open_store(path, max_staleness=1, eta=1)
    assert state(again) == before and not again.ready and not again.in_progress
    assert ingest(again, ID, chunk(seq=2, ep="idle", turn=1, obs=(3,))) == ("rejected", "episode_closed")
    journal2.close()


def test_compaction_keeps_live_state_and_shrinks_the_log(tmp_path):
    path = tmp_path / "wal.log"
    store, journal = open_store(path, eta=50, max_staleness=50, max_items=1000, max_running=1000)
    big = tuple(range(1, 2000))
    for i in range(40):
        ingest_logged(store, journal, chunk(seq=i, ep=f"e{i}", obs=big, done=i < 39))
    store.take_batch(0, 30)
    before, size = state(store), path.stat().st_size
    journal.compact(store)
    assert path.stat().st_size < size / 2
    ingest_logged(store, journal, chunk(seq=40, ep="after"))
    before = state(store)
    journal.close()
    again, journal2 = open_store(path, eta=50, max_staleness=50, max_items=1000, max_running=1000)
    assert state(again) == before
    assert ingest(again, ID, chunk(seq=5, ep="e5")) == ("duplicate", "")
    got, _ = again.take_batch(0, 9)
    assert [e.episode_id for e in got] == [f"e{i}" for i in range(30, 39)]
    assert {k for k, _ in WalFile(path).records()} >= {CHUNK}
    journal2.close()


def test_replay_does_not_count_as_new_traffic(tmp_path):
    path = tmp_path / "wal.log"
    store, journal = open_store(path)
    ingest_logged(store, journal, chunk(seq=0, ep="a", done=True))
    journal.close()
    again = make_store()
    WalJournal(WalFile(path), metrics_of(again), compact_bytes=1 << 20).replay(again)
    assert not metrics_of(again).registry.get_sample_value("turnstream_buffer_chunks_total", {"outcome": "ok"})
    assert metrics_of(again).registry.get_sample_value("turnstream_buffer_wal_replayed_records_total") == 1
    assert list(again.ready) == ["a"]


def test_a_message_of_several_chunks_is_replayed_as_it_came(tmp_path):
    path = tmp_path / "wal.log"
    store, journal = open_store(path)
    sent = pack([chunk(seq=0, ep="u", obs=(1, 2, 3), gen=(4, 5), allowed=(4, 5), done=True),
                 chunk(seq=1, ep="v", obs=(6,), gen=(7,), done=True, logp=(0.5,))])
    assert store.ingest_message(ID, sent, encode(sent)) == [(0, "ok", ""), (1, "rejected", "bad_logprob")]
    journal.close()

    again, journal2 = open_store(path)
    replayed = again.ready["u"].turns[0]
    for name in ("obs_tokens", "gen_tokens", "allowed_tokens"):
        assert getattr(replayed, name).dtype == np.uint32
        np.testing.assert_array_equal(getattr(replayed, name), getattr(store.ready["u"].turns[0], name))
    assert list(again.ready) == ["u"] and ingest(again, ID, chunk(seq=1, ep="v", done=True)) == ("duplicate", "")
    journal2.close()
