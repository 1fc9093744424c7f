"""Segments of open episodes (buffer.segment_turns): served before the episode ends, each turn trained once
(also through duplicates and a WAL replay), the staleness bound per segment, and the learner's bootstrap
from the critic's value at the segment's boundary."""
from __future__ import annotations

import numpy as np
import torch

from turnstream.buffer.store.episodes import Episode, Segment, flatten
from turnstream.learner.estimators.advantages import gae, whiten
from turnstream.learner.batch.tensors import to_tensors
from turnstream.core.config import LearnerSection
from tests import estimator_compute as estimators
from turnstream.learner.estimators.turn_gae import TurnGae
from turnstream.learner.step.objective import update_weights
from turnstream.learner.estimators.spo import SpoTracker
from tests.unit.test_buffer_wal import ingest_logged, open_store
from tests.unit.test_store import ID, chunk, ingest, make_store, metrics_of

GEN = (4, 5, 6)


def play(store, turns, *, ep="e0", start_seq=0, versions=0, done_at=None, reward=0.5):
    """Ingest turns `turns` of episode `ep` (3 generated tokens each, reward 0.5 after each turn)."""
    for i, t in enumerate(turns):
        c = chunk(seq=start_seq + i, ep=ep, turn=t, obs=(1, 2) if t == 0 else (3,), gen=GEN, versions=versions,
                  reward=reward, done=t == done_at)
        assert ingest(store, ID, c) == ("ok", "")


def trained_turns(batch) -> list[tuple[str, int]]:
    """(episode id, turn) of every trained action token's turn in a served Batch, one entry per turn."""
    tb = to_tensors(batch, 64)
    pairs = {(batch.episode_ids[int(e)], int(t)) for e, t, keep in
             zip(tb.act_episode, tb.act_turn, tb.act_trained) if keep}
    return sorted(pairs)


def serve(store, n=4, version=0):
    got = store.take_batch(version, n)
    return None if got is None else flatten(got[0], 1, store.learner_version, got[1])


def test_an_open_episode_is_served_in_segments_and_every_turn_once():
    store = make_store(batch_episodes=1, segment_turns=2)
    play(store, [0, 1])
    assert serve(store, 1) is None  # turn 1 would have to close a segment of one turn: fewer than 2
    play(store, [2], start_seq=2)
    first = serve(store, 1)
    assert first.first_turns.tolist() == [0] and first.bootstrap_turns.tolist() == [2]
    assert trained_turns(first) == [("e0", 0), ("e0", 1)]
    assert serve(store, 1) is None  # turns 0 and 1 are gone; turn 2 alone cannot form a segment yet
    play(store, [3, 4], start_seq=3)
    play(store, [5], start_seq=5, done_at=5)
    rest = serve(store, 1)
    assert rest.first_turns.tolist() == [2] and rest.bootstrap_turns.tolist() == [-1]
    assert trained_turns(rest) == [("e0", t) for t in range(2, 6)]
    assert serve(store, 1) is None and not store.in_progress and not store.ready
    assert metrics_of(store).registry.get_sample_value("turnstream_buffer_segments_served_total") == 1
    assert metrics_of(store).registry.get_sample_value("turnstream_buffer_turn_to_train_seconds_count") == 6
    assert metrics_of(store).registry.get_sample_value("turnstream_buffer_turn_to_train_versions_count") == 6


def test_segment_layout_context_trained_and_the_bootstrap_token():
    store = make_store(batch_episodes=1, segment_turns=1)
    play(store, [0, 1])
    serve(store, 1)  # turn 0, closed by turn 1
    play(store, [2], start_seq=2)
    batch = serve(store, 1)  # turn 1 trained; turn 0 is context; turn 2 closes it with one token
    assert batch.first_turns.tolist() == [1] and batch.bootstrap_turns.tolist() == [2]
    assert batch.tokens.tolist() == [1, 2, *GEN, 3, *GEN, 3, GEN[0]]
    assert batch.action_mask.tolist() == [0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 1]
    assert batch.versions.tolist() == [-1] * 6 + [0, 0, 0, -1, 0]
    np.testing.assert_allclose(batch.turn_rewards, [0.5, 0.5, 0.5])


def test_time_trigger_serves_a_short_segment_after_segment_after_s():
    store = make_store(batch_episodes=1, segment_turns=5, segment_after_s=2.0)
    play(store, [0, 1])
    ep = store.in_progress["e0"]
    assert store._with_open_segments(now=ep.arrived[0] + 1.0) is store.ready  # not yet
    ready = store._with_open_segments(now=ep.arrived[0] + 2.5)
    assert [(type(s), s.end) for s in ready.values()] == [(Segment, 1)]


def test_a_duplicate_chunk_does_not_serve_a_turn_twice():
    store = make_store(batch_episodes=1, segment_turns=1)
    play(store, [0, 1])
    served = trained_turns(serve(store, 1))
    assert ingest(store, ID, chunk(seq=1, ep="e0", turn=1, obs=(3,), gen=GEN)) == ("duplicate", "")
    assert serve(store, 1) is None
    play(store, [2], start_seq=2, done_at=2)
    served += trained_turns(serve(store, 1))
    assert served == [("e0", 0), ("e0", 1), ("e0", 2)]


def test_a_served_segment_is_not_served_again_after_a_restart(tmp_path):
    path = tmp_path / "wal.log"
    store, journal = open_store(path, batch_episodes=1, segment_turns=1)
    for t in range(3):
        assert ingest_logged(store, journal, chunk(seq=t, ep="e0", turn=t, obs=(3,), gen=GEN)) == ("ok", "")
    served = trained_turns(serve(store, 1))
    journal.commit()
    journal.close()
    again, journal = open_store(path, batch_episodes=1, segment_turns=1)  # the buffer restarted
    assert again.in_progress["e0"].served == 2
    assert ingest_logged(again, journal, chunk(seq=3, ep="e0", turn=3, obs=(3,), gen=GEN, done=True)) == ("ok", "")
    served += trained_turns(serve(again, 1))
    assert served == [("e0", t) for t in range(4)]
    journal.compact(again)  # nothing left; and a compacted log keeps how far an open episode was served
    journal.close()


def test_compaction_keeps_the_served_turns_of_an_open_episode(tmp_path):
    path = tmp_path / "wal.log"
    store, journal = open_store(path, batch_episodes=1, segment_turns=1)
    for t in range(3):
        ingest_logged(store, journal, chunk(seq=t, ep="e0", turn=t, obs=(3,), gen=GEN))
    serve(store, 1)
    journal.compact(store)
    journal.close()
    again, journal = open_store(path, batch_episodes=1, segment_turns=1)
    assert again.in_progress["e0"].served == 2 and sorted(again.in_progress["e0"].turns) == [0, 1, 2]
    journal.close()


def test_a_long_episode_is_not_stale_for_being_long_and_no_token_over_the_bound_is_served():
    store = make_store(batch_episodes=1, eta=1, max_staleness=1, segment_turns=1)
    play(store, [0, 1], versions=0)
    assert trained_turns(serve(store, 1, version=0)) == [("e0", 0)]
    play(store, [2, 3], start_seq=2, versions=2)
    store.set_learner_version(3)  # turn 1 (version 0) is unserved and 3 versions old; turns 2 and 3 are fresh
    store.expire()
    assert "e0" in store.in_progress  # its stale turn is skipped, not the episode
    assert trained_turns(serve(store, 1, version=3)) == [("e0", 2)]
    assert metrics_of(store).registry.get_sample_value("turnstream_buffer_stale_turns_skipped_total") == 1
    # a long episode whose old turns were served is judged on its unserved turns alone
    play(store, [0], ep="e1", start_seq=10, versions=3)
    play(store, [1], ep="e1", start_seq=11, versions=4)
    assert trained_turns(serve(store, 1, version=4)) == [("e1", 0)]
    play(store, [2, 3], ep="e1", start_seq=12, versions=4)
    store.set_learner_version(5)  # turn 0 (version 3) would be 2 versions old; it was served already
    store.expire()
    batch = serve(store, 1, version=5)
    assert trained_turns(batch) == [("e1", 1), ("e1", 2)]
    trained = np.asarray(batch.action_mask, bool)
    assert (batch.learner_version - batch.versions[trained]).max() <= 1


def test_a_complete_episode_keeps_its_fresh_turns_and_is_dropped_only_with_none(tmp_path):
    """Past the bound, a complete episode served in segments loses its stale turns, journaled so that a
    restarted buffer neither serves them nor counts them again; with no fresh turn it is dropped as stale."""
    path = tmp_path / "wal.log"
    store, journal = open_store(path, batch_episodes=1, eta=1, max_staleness=1, segment_turns=4)
    for t, v in enumerate((0, 0, 2, 2)):
        ingest_logged(store, journal, chunk(seq=t, ep="e0", turn=t, obs=(3,), gen=GEN, versions=v, done=t == 3))
    for t in range(2):
        ingest_logged(store, journal, chunk(seq=10 + t, ep="e1", turn=t, obs=(3,), gen=GEN, done=t == 1))
    store.set_learner_version(3)
    assert list(store.ready) == ["e0"] and store.ready["e0"].served == 2  # e1 had nothing fresh
    assert metrics_of(store).registry.get_sample_value("turnstream_buffer_dropped_episodes_total", {"reason": "stale"}) == 1
    journal.commit()
    journal.close()
    again, journal = open_store(path, batch_episodes=1, eta=1, max_staleness=1, segment_turns=4)
    assert again.ready["e0"].served == 2 and "e1" not in again.ready
    batch = serve(again, 1, version=3)
    assert trained_turns(batch) == [("e0", 2), ("e0", 3)]
    trained = np.asarray(batch.action_mask, bool)
    assert (batch.learner_version - batch.versions[trained]).max() <= 1
    journal.close()


def _segment_batch():
    """Turns 0..2 of an open episode trained, turn 3 closes the segment (rewards 0.5 each)."""
    ep = Episode("e", ("a", 0), "p")
    for t in range(4):
        ep.add(chunk(seq=t, ep="e", turn=t, obs=(3,), gen=(5, 6), reward=0.5))
    return flatten([Segment(ep, 0, 3, 0.0)], 1, 0, 0)


def test_turn_gae_bootstraps_from_the_critic_value_at_the_boundary():
    batch = _segment_batch()
    tb = to_tensors(batch, 64)
    assert tb.act_trained.tolist() == [True] * 6 + [False]
    values = torch.tensor([0.1, 9.0, 0.2, 9.0, 0.3, 9.0, 0.7])  # boundaries: 0.1, 0.2, 0.3; bootstrap 0.7
    adv = estimators.compute("turn_gae", batch, tb, tracker=SpoTracker(), spo_normalize="token", gamma=0.9,
                             lam=0.8, old_values=values)
    raw, ret = gae(np.array([0.5, 0.5, 0.5]), np.array([0.1, 0.2, 0.3]), 0.9, 0.8, bootstrap=0.7)
    np.testing.assert_allclose(adv.value_targets[adv.value_mask].numpy(), ret, atol=1e-6)
    np.testing.assert_allclose(adv.token_adv[:6].numpy(), whiten(np.repeat(raw, 2)), atol=1e-5)
    assert adv.token_adv[6] == 0 and not adv.value_mask[6]
    assert not TurnGae(LearnerSection(estimator="turn_gae")).value_positions(tb)[6]


def test_the_bootstrap_token_carries_no_loss_weight():
    batch = _segment_batch()
    tb = to_tensors(batch, 64)
    adv = estimators.compute("turn_gae", batch, tb, tracker=SpoTracker(), spo_normalize="token", gamma=0.9,
                             lam=0.8, old_values=torch.zeros(7))

    class Inputs:
        pass

    x = Inputs()
    x.tb, x.advantages = tb, adv
    w = update_weights(x, torch.arange(1), "token-mean")
    assert w.policy[6] == 0 and w.value[6] == 0
    np.testing.assert_allclose(w.policy[:6].numpy(), np.full(6, 1 / 6), atol=1e-7)


def test_the_audit_marks_stale_turns_passed_over_apart_from_served_segments(tmp_path):
    import json

    from turnstream.buffer.audit import BufferAudit
    from turnstream.core.audit import AuditLog

    store = make_store(batch_episodes=1, eta=1, max_staleness=1, segment_turns=2)
    audit_path = tmp_path / "audit.jsonl"
    store.listeners.add(BufferAudit(AuditLog(audit_path)))
    play(store, [0], versions=0)
    play(store, [1, 2, 3], start_seq=1, versions=2)
    store.set_learner_version(3)  # turn 0 (version 0) is past the bound: passed over, a span of one turn
    assert trained_turns(serve(store, 1, version=3)) == [("e0", 1), ("e0", 2)]
    lines = [json.loads(line) for line in audit_path.read_text().splitlines()]
    assert [(line["turns"], line.get("stale", False)) for line in lines if "served_segment" in line] == [
        ([0, 1], True), ([1, 3], False)]
