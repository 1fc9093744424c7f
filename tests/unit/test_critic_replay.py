"""Critic replay (buffer/store/critic_replay.py) for turn-level TD (`turn_td`): episodes already served,
or dropped as stale, are served again to the critic alone, marked, on top of the batch, within the critic's own
bound; never consumed, sampled or counted as fresh. That they cannot move the policy:
tests/unit/test_critic_only_isolation.py."""
from __future__ import annotations

import json

import pytest

from turnstream.buffer.audit import BufferAudit
from turnstream.buffer.store.critic_replay import CriticReplayPool
from turnstream.buffer.store.episodes import CriticReplay, Episode, flatten
from turnstream.core.audit import AuditLog
from turnstream.core.config import ConfigError, load_config
from tests.unit.test_buffer_wal import ingest_logged, open_store, restarted
from tests.unit.test_store import ID, chunk, ingest, make_store, metric


def pool(**kw) -> CriticReplayPool:
    args = dict(share=1.0, max_staleness=8, capacity=100)
    args.update(kw)
    return CriticReplayPool(**args)


def finish(store, ep: str, *, seq: int, versions: int = 0) -> int:
    assert ingest(store, ID, chunk(seq=seq, ep=ep, done=True, versions=versions)) == ("ok", "")
    return seq + 1


def ids(items) -> list[tuple[str, bool]]:
    return [(item.episode_id, isinstance(item, CriticReplay)) for item in items]


def test_served_episodes_come_back_to_the_critic_marked_on_top_of_the_batch():
    store = make_store(batch_episodes=2, eta=4, max_staleness=4, critic=pool())
    seq = 0
    for ep in ("e0", "e1"):
        seq = finish(store, ep, seq=seq)
    first, _ = store.take_batch(0, 2)
    assert ids(first) == [("e0", False), ("e1", False)]  # nothing served yet: nothing for the critic
    for ep in ("e2", "e3"):
        seq = finish(store, ep, seq=seq)
    second, _ = store.take_batch(0, 2)
    assert ids(second)[:2] == [("e2", False), ("e3", False)]
    assert sorted(ids(second)[2:]) == [("e0", True), ("e1", True)]  # share 1: a batch's worth more
    assert flatten(second, 1, 0, 0).critic_only.tolist() == [False, False, True, True]
    assert flatten(first, 1, 0, 0).critic_only.size == 0  # none in the batch: the column stays empty
    # nothing left the store twice: the rate limiter and `served` count the fresh episodes alone
    assert store.limiter.samples == 4 and not store.ready
    assert metric(store, "turnstream_buffer_episodes_total", event="served") == 4
    assert metric(store, "turnstream_buffer_episodes_total", event="critic_replayed") == 2
    assert metric(store, "turnstream_buffer_critic_turns_total", state="within_bound") == 2


def test_the_critics_bound_not_the_policys_limits_what_it_is_served():
    store = make_store(batch_episodes=1, eta=1, max_staleness=1, critic=pool(max_staleness=4))
    seq = finish(store, "old", seq=0, versions=0)
    store.take_batch(0, 1)
    seq = finish(store, "new", seq=seq, versions=3)
    got, _ = store.take_batch(3, 1)
    assert ids(got) == [("new", False), ("old", True)]  # staleness 3: past the policy's bound, within the critic's
    assert store.max_served_staleness == 0  # the policy's figure: critic-only episodes are not in it
    assert metric(store, "turnstream_buffer_critic_turns_total", state="beyond_bound") == 1
    seq = finish(store, "newer", seq=seq, versions=5)
    got, _ = store.take_batch(5, 1)
    assert ids(got) == [("newer", False), ("new", True)]  # "old" is 5 versions old: past the critic's bound too
    assert "old" not in store.critic.episodes


def test_an_episode_dropped_as_stale_still_teaches_the_critic():
    store = make_store(batch_episodes=1, eta=1, max_staleness=1, critic=pool(max_staleness=4))
    seq = finish(store, "late", seq=0, versions=0)
    store.set_learner_version(2)  # past the policy's bound before it was ever served: dropped, never trained
    assert not store.ready and metric(store, "turnstream_buffer_dropped_episodes_total", reason="stale") == 1
    finish(store, "fresh", seq=seq, versions=2)
    got, _ = store.take_batch(2, 1)
    assert ids(got) == [("fresh", False), ("late", True)]


def test_the_pool_keeps_the_newest_up_to_its_capacity_and_draws_without_replacement():
    p = pool(capacity=3, share=2.0)
    episodes = [Episode(f"e{i}", ("a", 0), "p") for i in range(5)]
    p.keep(episodes)
    assert list(p.episodes) == ["e2", "e3", "e4"]
    drawn = [r.episode_id for r in p.due(4, 0)]  # share 2 of 4 asks for 8; three are held
    assert sorted(drawn) == ["e2", "e3", "e4"]


def test_the_write_ahead_log_never_consumes_a_critic_replay_and_a_restart_empties_the_pool(tmp_path):
    path = tmp_path / "wal.log"
    store, journal = open_store(path, batch_episodes=1, eta=4, max_staleness=4, critic=pool())
    for seq, ep in enumerate(("a", "b", "c")):
        ingest_logged(store, journal, chunk(seq=seq, ep=ep, done=True))
    store.take_batch(0, 1)
    got, _ = store.take_batch(0, 1)
    assert ids(got) == [("b", False), ("a", True)]
    again = restarted(path, store, journal, batch_episodes=1, eta=4, max_staleness=4, critic=pool())
    assert list(again.ready) == ["c"]
    assert not again.critic.episodes  # memory only (documented): it refills from what is served next


def test_the_audit_trail_notes_critic_replays_apart_from_what_was_served(tmp_path):
    store = make_store(batch_episodes=1, eta=4, max_staleness=4, critic=pool())
    audit_path = tmp_path / "audit.jsonl"
    store.listeners.add(BufferAudit(AuditLog(audit_path)))
    seq = 0
    for ep in ("a", "b"):
        seq = finish(store, ep, seq=seq)
    store.take_batch(0, 1)
    store.take_batch(0, 1)
    lines = [json.loads(line) for line in audit_path.read_text().splitlines()]
    assert [line["served"] for line in lines if "served" in line] == [["a"], ["b"]]
    assert [(line["critic_replayed"], line["staleness"]) for line in lines if "critic_replayed" in line] == [
        (["a"], [0])]


def test_the_learner_counts_neither_episodes_nor_staleness_of_critic_only_episodes():
    from turnstream.learner.batch.tensors import to_tensors
    from turnstream.learner.step.packing import Dropped
    from turnstream.learner.step.step_stats import batch_stats

    fresh, old = Episode("fresh", ("a", 0), "p"), Episode("old", ("a", 0), "p")
    for t in range(2):
        fresh.add(chunk(seq=t, ep="fresh", turn=t, done=t == 1, versions=9, reward=float(t == 1)))
    for t in range(3):
        old.add(chunk(seq=10 + t, ep="old", turn=t, done=t == 2, versions=2))
    batch = flatten([fresh, CriticReplay(old)], 1, 10, 0)
    stats = batch_stats(batch, to_tensors(batch, 64), Dropped([], []))
    assert (stats["episodes"], stats["return_mean"], stats["staleness_max"]) == (1, 1.0, 1)
    assert stats["critic_only"] == 1 and stats["critic_turns_by_staleness"] == {8: 3}


def test_critic_replay_is_off_unless_a_share_is_set():
    from turnstream.buffer.main import critic_replay

    assert critic_replay(load_config(None, ["learner.estimator=turn_td"])) is None
    assert critic_replay(load_config(None, ["learner.estimator=turn_td", "buffer.critic_replay.share=0.5"])).share == 0.5


@pytest.mark.parametrize("override, setting", [
    (["buffer.critic_replay.share=1"], "buffer.critic_replay.share"),
    (["buffer.critic_replay.share=5", "learner.estimator=turn_td"], "buffer.critic_replay.share"),
    (["learner.estimator=turn_td", "buffer.critic_replay.share=1", "buffer.segment_turns=4"],
     "buffer.critic_replay.share"),
    (["learner.estimator=turn_td", "buffer.critic_replay.share=1", "buffer.critic_replay.max_staleness=2"],
     "buffer.critic_replay.max_staleness"),
])
def test_settings_critic_replay_cannot_serve_are_refused_naming_the_setting(override, setting):
    with pytest.raises(ConfigError, match=setting.replace(".", r"\.")):
        load_config(None, override)


def test_a_critic_share_that_gives_a_batch_no_episode_is_refused_naming_the_share_and_the_batch_size():
    """share * batch_episodes rounds down to the episodes a batch serves the critic: under one, critic replay would
    be on in the config and off in every batch."""
    with pytest.raises(ConfigError) as info:
        load_config(None, ["buffer.critic_replay.share=0.1", "buffer.batch_episodes=8"])
    message = str(info.value)
    assert message.startswith("buffer.critic_replay.share: ") and "\n" not in message
    assert "batch_episodes (8)" in message and "0.125" in message
    cfg = load_config(None, ["buffer.critic_replay.share=0.125", "buffer.batch_episodes=8", "learner.estimator=turn_td"])
    pool = CriticReplayPool(share=cfg.buffer.critic_replay.share, max_staleness=16, capacity=8)
    pool.keep([Episode("e0", ("a", 0), "p")])
    assert len(pool.due(cfg.buffer.batch_episodes, learner_version=0)) == 1
