"""Positive replay (buffer/store/positive_replay.py): rare successes on hard tasks are served again, marked, within
the staleness bound, never consumed or counted as fresh; the audit trail, the write-ahead log and the learner's
counts see them apart."""
from __future__ import annotations

import json

import numpy as np
import pytest

from turnstream.buffer.audit import BufferAudit
from turnstream.buffer.pass_rate_file import write_pass_rates
from turnstream.buffer.store.episodes import Episode, Replay, flatten
from turnstream.buffer.store.positive_replay import PassRates, PositiveReplay
from turnstream.core.audit import AuditLog
from turnstream.core.config import ConfigError, load_config
from turnstream.learner.step.step_stats import replayed_episodes
from tests.unit.test_buffer_wal import ingest_logged, open_store, restarted
from tests.unit.test_store import ID, chunk, ingest, make_store, metric


def positive(**kw) -> PositiveReplay:
    args = dict(share=0.5, hard_below=0.6, success_return=1.0, window=8, max_replays=2)
    args.update(kw)
    return PositiveReplay(**args)


def finish(store, ep: str, *, seq: int, prompt: str, reward: float, versions: int = 0) -> int:
    assert ingest(store, ID, chunk(seq=seq, ep=ep, prompt=prompt, reward=reward, done=True,
                                   versions=versions)) == ("ok", "")
    return seq + 1


def ids(items) -> list[tuple[str, bool]]:
    return [(item.episode_id, isinstance(item, Replay)) for item in items]


def test_the_pass_rate_counts_the_newest_window_of_a_tasks_episodes():
    rates = PassRates(window=4, success_return=1.0)
    store = make_store()
    seq = 0
    for i, reward in enumerate([1.0, 0.0, 0.0, 0.0, 0.0, 0.5]):
        seq = finish(store, f"e{i}", seq=seq, prompt="hard", reward=reward)
        rates.add(store.ready[f"e{i}"])
    assert (rates.of("hard").successes, rates.of("hard").episodes) == (0, 4)  # the success fell out; 0.5 < 1.0
    assert rates.of("never seen").rate == 0.0


def test_a_success_on_a_hard_task_is_served_again_marked_within_the_batchs_share():
    store = make_store(batch_episodes=4, eta=4, max_staleness=4, positive=positive())
    seq = 0
    for i in range(7):  # one success in eight attempts: pass rate 1/8 < 0.6
        seq = finish(store, f"fail{i}", seq=seq, prompt="hard", reward=0.0)
    seq = finish(store, "win", seq=seq, prompt="hard", reward=1.0)
    first, _ = store.take_batch(0, 4)
    assert ids(first) == [(f"fail{i}", False) for i in range(4)]
    second, _ = store.take_batch(0, 4)
    assert ids(second) == [("fail4", False), ("fail5", False), ("fail6", False), ("win", False)]
    assert list(store.positive.kept) == ["win"]
    for i in range(4):
        seq = finish(store, f"new{i}", seq=seq, prompt="hard", reward=0.0)
    # half the batch may be replays; one is kept, so three fresh episodes and the replay after them
    third, _ = store.take_batch(0, 4)
    assert ids(third) == [("new0", False), ("new1", False), ("new2", False), ("win", True)]
    batch = flatten(third, 1, 0, 0)
    assert batch.replayed.tolist() == [False, False, False, True]
    assert batch.returns == [0.0, 0.0, 0.0, 1.0]
    # the fourth fresh one still waits for a batch; the replay rides along again (max_replays = 2), then is gone
    for i in range(4, 7):
        seq = finish(store, f"new{i}", seq=seq, prompt="hard", reward=0.0)
    fourth, _ = store.take_batch(0, 4)
    assert ids(fourth) == [("new3", False), ("new4", False), ("new5", False), ("win", True)]
    assert not store.positive.kept
    assert metric(store, "turnstream_buffer_episodes_total", event="replayed") == 2
    assert metric(store, "turnstream_buffer_episodes_total", event="kept_for_replay") == 1
    # a replay is no sample: the rate limiter and `served` count the fresh episodes alone
    assert store.limiter.samples == 14
    assert metric(store, "turnstream_buffer_episodes_total", event="served") == 14


def test_an_easy_tasks_success_and_a_hard_tasks_failure_are_not_kept():
    store = make_store(batch_episodes=4, eta=4, max_staleness=4, positive=positive())
    seq = 0
    for i in range(2):
        seq = finish(store, f"easy{i}", seq=seq, prompt="easy", reward=1.0)  # pass rate 1
        seq = finish(store, f"hard{i}", seq=seq, prompt="hard", reward=0.0)
    store.take_batch(0, 4)
    assert not store.positive.kept


def test_a_kept_success_is_never_served_past_the_staleness_bound():
    store = make_store(batch_episodes=2, eta=2, max_staleness=2, positive=positive(max_replays=5))
    seq = finish(store, "fail", seq=0, prompt="hard", reward=0.0)
    seq = finish(store, "win", seq=seq, prompt="hard", reward=1.0, versions=0)
    store.take_batch(0, 2)
    assert list(store.positive.kept) == ["win"]
    seq = finish(store, "a", seq=seq, prompt="other", reward=0.0, versions=2)
    got, _ = store.take_batch(2, 2)  # staleness 2: at the bound, served again
    assert ids(got) == [("a", False), ("win", True)]
    assert store.max_served_staleness == 2
    seq = finish(store, "b", seq=seq, prompt="other", reward=0.0, versions=3)
    seq = finish(store, "c", seq=seq, prompt="other", reward=0.0, versions=3)
    got, _ = store.take_batch(3, 2)  # staleness 3 > 2: forgotten, the batch is all fresh
    assert ids(got) == [("b", False), ("c", False)]
    assert not store.positive.kept


def test_the_write_ahead_log_never_consumes_a_replay_twice_and_a_restart_forgets_the_kept(tmp_path):
    path = tmp_path / "wal.log"
    store, journal = open_store(path, batch_episodes=2, eta=4, max_staleness=4, positive=positive())
    seq = 0
    for ep, reward in (("fail", 0.0), ("win", 1.0), ("x", 0.0), ("y", 0.0)):
        ingest_logged(store, journal, chunk(seq=seq, ep=ep, prompt="hard", reward=reward, done=True))
        seq += 1
    store.take_batch(0, 2)
    got, _ = store.take_batch(0, 2)
    assert ids(got) == [("x", False), ("win", True)]
    again = restarted(path, store, journal, batch_episodes=2, eta=4, max_staleness=4, positive=positive())
    assert list(again.ready) == ["y"]
    assert not again.positive.kept  # memory only (documented): a restart refills it from new successes


def test_the_audit_trail_notes_replays_apart_from_what_was_served(tmp_path):
    store = make_store(batch_episodes=2, eta=4, max_staleness=4, positive=positive())
    audit_path = tmp_path / "audit.jsonl"
    store.listeners.add(BufferAudit(AuditLog(audit_path)))
    seq = 0
    for ep, reward in (("fail", 0.0), ("win", 1.0), ("x", 0.0)):
        seq = finish(store, ep, seq=seq, prompt="hard", reward=reward)
    store.take_batch(0, 2)
    store.take_batch(0, 2)
    lines = [json.loads(line) for line in audit_path.read_text().splitlines()]
    served = [line["served"] for line in lines if "served" in line]
    replayed = [(line["replayed"], line["kept_for_replay"]) for line in lines if "replayed" in line]
    assert served == [["fail", "win"], ["x"]]  # every acked episode leaves the store once
    assert replayed == [([], ["win"]), (["win"], [])]


def test_the_learner_does_not_count_a_replay_as_an_episode():
    store = make_store(batch_episodes=2, eta=4, max_staleness=4, positive=positive())
    seq = 0
    for ep, reward in (("fail", 0.0), ("win", 1.0), ("x", 0.0)):
        seq = finish(store, ep, seq=seq, prompt="hard", reward=reward)
    store.take_batch(0, 2)
    got, _ = store.take_batch(0, 2)
    batch = flatten(got, 2, 0, 0)
    assert replayed_episodes(batch).tolist() == [False, True]
    assert replayed_episodes(flatten(got[:1], 3, 0, 0)).tolist() == [False]  # no replay: the column is empty


def test_the_pass_rate_file_lists_the_hardest_task_first(tmp_path):
    store = make_store(batch_episodes=4, eta=4, max_staleness=4, positive=positive())
    seq = 0
    for ep, prompt, reward in (("a", "easy", 1.0), ("b", "hard", 0.0), ("c", "hard", 1.0), ("d", "mid", 0.0)):
        seq = finish(store, ep, seq=seq, prompt=prompt, reward=reward)
    write_pass_rates(tmp_path / "pass_rates.json", store.positive)
    doc = json.loads((tmp_path / "pass_rates.json").read_text())
    assert [(t["prompt_key"], t["pass_rate"], t["episodes"]) for t in doc["tasks"]] == [
        ("mid", 0.0, 1), ("hard", 0.5, 2), ("easy", 1.0, 1)]


@pytest.mark.parametrize("override, setting", [
    (["buffer.positive_replay.share=0.6"], "buffer.positive_replay.share"),
    (["buffer.positive_replay.share=0.1", "buffer.segment_turns=4", "learner.estimator=turn_gae"],
     "positive_replay.share"),
    (["buffer.positive_replay.share=0.1", "buffer.sampling=group", "tasks.group_size=2", "learner.estimator=grpo"],
     "positive_replay.share"),
])
def test_settings_positive_replay_cannot_serve_are_refused_naming_the_setting(override, setting):
    with pytest.raises(ConfigError, match=setting.replace(".", r"\.")):
        load_config(None, override)


def test_a_share_that_gives_a_batch_no_replay_slot_is_refused_naming_the_share_and_the_batch_size():
    """share * batch_episodes rounds down to the replays a batch may hold: under one, positive replay would be on
    in the config and off in every batch."""
    with pytest.raises(ConfigError) as info:
        load_config(None, ["buffer.positive_replay.share=0.1", "buffer.batch_episodes=8"])
    message = str(info.value)
    assert message.startswith("buffer.positive_replay.share: ") and "\n" not in message
    assert "batch_episodes (8)" in message and "0.125" in message
    cfg = load_config(None, ["buffer.positive_replay.share=0.125", "buffer.batch_episodes=8"])
    replay = positive(share=cfg.buffer.positive_replay.share)
    replay.keep([Episode("e0", ("a", 0), "p")])
    assert len(replay.due(cfg.buffer.batch_episodes, learner_version=0, max_staleness=0)) == 1


def test_a_learner_step_trains_on_a_replay_without_folding_or_counting_it():
    """The SPO tracker holds the same state as after a step on the fresh episodes alone, and the step's counts
    (episodes, return_mean: the rolling success of every report) leave the replay out, which it trained on."""
    import copy

    from turnstream.learner.step.packing import subset
    from turnstream.learner.step.trainer import Trainer
    from tests.learner_batches import synthetic_batch, tiny_causal_lm
    from tests.unit.test_learner_trainer import cfg_for

    batch = synthetic_batch(6, seed=3)
    batch.replayed = np.array([False] * 5 + [True])
    model = tiny_causal_lm()
    with_replay, fresh_only = Trainer(copy.deepcopy(model), cfg_for("spo")), Trainer(model, cfg_for("spo"))
    stats = with_replay.step(batch)
    fresh_stats = fresh_only.step(subset(batch, np.arange(5)))
    assert with_replay.estimator.tracker.state.keys() == fresh_only.estimator.tracker.state.keys()
    for key, ab in fresh_only.estimator.tracker.state.items():
        assert with_replay.estimator.tracker.state[key] == pytest.approx(ab, abs=1e-6)
    assert (stats["episodes"], stats["replayed"]) == (5, 1)
    assert stats["return_mean"] == pytest.approx(fresh_stats["return_mean"])
    assert stats["action_tokens"] > fresh_stats["action_tokens"]  # the replay's tokens were trained on
