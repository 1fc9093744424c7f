"""buffer.sampling policies and token budgets, buffer.ratelimit limiter, gate and config validation."""
from __future__ import annotations

import asyncio
import time

import pytest

from turnstream.buffer.store.ratelimit import BlockedClock, Cancelled, Gate, RateLimiter, limiter_problem
from turnstream.checks.preflight import preflight
from turnstream.core.config import ConfigError, load_config
from tests.unit.test_store import ID, chunk, ingest, make_store, metric, metrics_of


def fill(store, specs):
    """specs: (episode_id, prompt_key, version, n_gen) -> one-turn complete episodes, in this order."""
    for seq, (ep, prompt, version, n_gen) in enumerate(specs):
        c = chunk(seq=seq, ep=ep, prompt=prompt, done=True, versions=version, gen=tuple(range(4, 4 + n_gen)))
        assert ingest(store, ID, c) == ("ok", "")


def ids(got):
    return [e.episode_id for e in got[0]]


# ---- policies ------------------------------------------------------------------------------------------

def test_fifo_serves_completion_order():
    store = make_store(eta=9, max_staleness=9)
    fill(store, [("a", "p", 0, 1), ("b", "p", 2, 1), ("c", "p", 1, 1)])
    assert ids(store.take_batch(2, 2)) == ["a", "b"]


def test_freshest_first_serves_newest_behaviour_version_first():
    store = make_store(eta=9, max_staleness=9, policy="freshest")
    fill(store, [("a", "p", 0, 1), ("b", "p", 2, 1), ("c", "p", 1, 1), ("d", "p", 2, 1)])
    assert ids(store.take_batch(2, 3)) == ["b", "d", "c"]
    assert list(store.ready) == ["a"]


def test_group_complete_serves_whole_groups_only():
    store = make_store(eta=9, max_staleness=9, policy="group", group_size=2, batch_episodes=4, max_items=100)
    fill(store, [("x1", "x", 0, 1), ("y1", "y", 0, 1), ("y2", "y", 0, 1), ("z1", "z", 0, 1)])
    assert store.take_batch(0, 4) is None  # only one complete group (y) so far: wait for a full batch
    fill_more = chunk(seq=10, ep="x2", prompt="x", done=True)
    ingest(store, ID, fill_more)
    got = ids(store.take_batch(0, 4))
    assert sorted(got[:2]) == ["y1", "y2"] and sorted(got[2:]) == ["x1", "x2"]  # y completed first
    assert list(store.ready) == ["z1"]


def test_a_group_left_incomplete_is_dropped_after_group_timeout_and_counted():
    store = make_store(eta=9, max_staleness=9, policy="group", group_size=2, batch_episodes=4, max_items=100,
                       group_timeout_s=30.0)
    fill(store, [("a1", "a", 0, 1), ("a2", "a", 0, 1), ("a3", "a", 0, 1), ("b1", "b", 0, 1)])
    accepted = store.admission.accepted
    now = time.monotonic()
    store.expire(now=now + 10)
    assert list(store.ready) == ["a1", "a2", "a3", "b1"]  # not yet
    store.expire(now=now + 31)
    # a1+a2 form a complete group and stay; a3 (its group's sibling never came) and b1 go
    assert list(store.ready) == ["a1", "a2"]
    assert store.admission.accepted == accepted - 2  # their admission room is free again
    assert metrics_of(store).registry.get_sample_value("turnstream_buffer_dropped_episodes_total",
                                             {"reason": "group_timeout"}) == 2


def test_groups_served_are_counted():
    store = make_store(eta=9, max_staleness=9, policy="group", group_size=2, batch_episodes=4, max_items=100)
    fill(store, [("a1", "a", 0, 1), ("b1", "b", 0, 1), ("a2", "a", 0, 1), ("b2", "b", 0, 1), ("c1", "c", 0, 1)])
    assert len(ids(store.take_batch(0, 4))) == 4
    assert metric(store, "turnstream_buffer_groups_served_total") == 2
    assert metric(store, "turnstream_buffer_samples_total") == 4


def fill_rewarded(store, specs, first_seq=0):
    """specs: (episode_id, prompt_key, reward) -> one-turn complete episodes with that return."""
    for seq, (ep, prompt, reward) in enumerate(specs, first_seq):
        assert ingest(store, ID, chunk(seq=seq, ep=ep, prompt=prompt, done=True, reward=reward)) == ("ok", "")


@pytest.mark.parametrize("drop_uniform", [False, True])
def test_groups_whose_members_all_got_the_same_return_are_dropped_only_when_asked(drop_uniform):
    store = make_store(eta=9, max_staleness=9, policy="group", group_size=2, batch_episodes=2, max_items=100,
                       drop_uniform_groups=drop_uniform)
    fill_rewarded(store, [("a1", "a", 1.0), ("a2", "a", 1.0), ("b1", "b", 0.0), ("b2", "b", 1.0), ("c1", "c", 0.0)])
    accepted = store.admission.accepted
    got = ids(store.take_batch(0, 2))
    dropped = metric(store, "turnstream_buffer_dropped_episodes_total", reason="uniform_group")
    if drop_uniform:
        assert got == ["b1", "b2"] and dropped == 2  # a: no variance, no signal for a group baseline
        assert store.admission.accepted == accepted - 2  # the dropped group's admission room is free again
    else:
        assert got == ["a1", "a2"] and dropped == 0
    assert list(store.ready) == (["c1"] if drop_uniform else ["b1", "b2", "c1"])  # an incomplete group waits


def test_group_batch_takes_only_as_many_whole_groups_as_fit():
    store = make_store(eta=9, max_staleness=9, policy="group", group_size=2, batch_episodes=4, max_items=100)
    fill(store, [("a1", "a", 0, 1), ("a2", "a", 0, 1), ("b1", "b", 0, 1), ("b2", "b", 0, 1)])
    assert ids(store.take_batch(0, 3)) == ["a1", "a2"]  # a second group would exceed 3 episodes


def test_token_budget_fills_up_to_the_budget():
    store = make_store(eta=9, max_staleness=9)
    fill(store, [("a", "p", 0, 2), ("b", "p", 0, 2), ("c", "p", 0, 2)])  # 3 obs + 2 gen = 5 tokens each
    assert store.take_batch(0, 10, max_tokens=12) is not None
    store = make_store(eta=9, max_staleness=9)
    fill(store, [("a", "p", 0, 2), ("b", "p", 0, 2), ("c", "p", 0, 2)])
    assert ids(store.take_batch(0, 10, max_tokens=12)) == ["a", "b"]  # c would make 15 > 12


def test_token_budget_waits_until_the_budget_is_reached():
    store = make_store(eta=9, max_staleness=9)
    fill(store, [("a", "p", 0, 2)])
    assert store.take_batch(0, 10, max_tokens=12) is None  # 5 of 12 tokens, more episodes may come
    ingest(store, ID, chunk(seq=5, ep="b", done=True))
    ingest(store, ID, chunk(seq=6, ep="c", done=True))
    assert ids(store.take_batch(0, 10, max_tokens=12)) == ["a", "b"]


def test_episode_larger_than_the_budget_is_served_alone_not_dropped():
    store = make_store(eta=9, max_staleness=9)
    fill(store, [("huge", "p", 0, 50), ("small", "p", 0, 1)])
    assert ids(store.take_batch(0, 10, max_tokens=20)) == ["huge"]


# ---- rate limiter ----------------------------------------------------------------------------------------

def test_limiter_blocks_samples_below_min_size_and_blocks_inserts_above_max_diff():
    lim = RateLimiter(samples_per_insert=1.0, min_size_to_sample=3, error_buffer=3)  # diff in [0, 6]
    assert not lim.can_sample(1, size=2)
    assert lim.insert_room() == 6
    lim.on_insert(6)
    assert lim.insert_room() == 0 and lim.can_sample(2, size=6)
    lim.on_sample(2)
    assert lim.insert_room() == 2
    assert lim.insert_room(pending=2) == 0  # admitted episodes count before they complete


def test_limiter_with_fractional_ratio():
    lim = RateLimiter(samples_per_insert=0.5, min_size_to_sample=2, error_buffer=2)  # diff in [-1, 3]
    assert lim.insert_room() == 6
    lim.on_insert(4)  # diff 2
    assert lim.can_sample(2, size=4) and not lim.can_sample(4, size=4)


def test_store_gives_no_credit_when_the_limiter_is_full_and_serving_unblocks_it():
    store = make_store(eta=9, max_staleness=9, limiter=RateLimiter(1.0, 1, 2))  # at most 3 ahead
    store.admission.on_credit_request(ID, "a0", 0, slots=10)
    assert store.grant_credits() == [(ID, 3)]
    fill(store, [("a", "p", 0, 1), ("b", "p", 0, 1), ("c", "p", 0, 1)])
    assert store.grant_credits() == []
    store.take_batch(0, 2)
    assert store.grant_credits() == [(ID, 2)]


def test_store_sample_blocks_until_the_limiter_allows():
    store = make_store(eta=9, max_staleness=9, limiter=RateLimiter(1.0, 3, 3))
    fill(store, [("a", "p", 0, 1), ("b", "p", 0, 1)])
    assert store.take_batch(0, 1) is None  # fewer than min_size_to_sample = 3 held
    fill_c = chunk(seq=9, ep="c", done=True)
    ingest(store, ID, fill_c)
    assert ids(store.take_batch(0, 1)) == ["a"]


@pytest.mark.parametrize("args, field", [
    (dict(spi=2.0, min_size=1, eb=10), "samples_per_insert"),
    (dict(spi=0.0, min_size=1, eb=10), "samples_per_insert"),
    (dict(spi=1.0, min_size=0, eb=10), "min_size_to_sample"),
    (dict(spi=1.0, min_size=200, eb=1000), "min_size_to_sample"),  # above max_items
    (dict(spi=1.0, min_size=40, eb=1000), "min_size_to_sample"),  # above (eta + 1) * B = 24
    (dict(spi=1.0, min_size=1, eb=4), "error_buffer"),  # window cannot hold a batch of 8
    (dict(spi=1.0, min_size=1, eb=-1), "error_buffer"),
])
def test_deadlocking_limiter_configs_are_refused(args, field):
    got, reason = limiter_problem(args["spi"], args["min_size"], args["eb"], batch_episodes=8, max_items=100, eta=2)
    assert got == field and reason


def test_working_limiter_config_passes():
    assert limiter_problem(1.0, 8, 4.5, batch_episodes=8, max_items=100, eta=2) == ("", "")


@pytest.mark.parametrize("override, field", [
    ("buffer.error_buffer=2", "buffer.error_buffer"),
    ("buffer.samples_per_insert=3", "buffer.samples_per_insert"),
    ("buffer.min_size_to_sample=100000", "buffer.min_size_to_sample"),
    ("buffer.sampling=lifo", "buffer.sampling"),
    ("buffer.wal_fsync=sometimes", "buffer.wal_fsync"),
    ("buffer.wal_fsync_interval_s=0", "buffer.wal_fsync_interval_s"),
])
def test_config_load_refuses_bad_buffer_settings_in_one_line(override, field):
    with pytest.raises(ConfigError) as info:
        preflight(load_config(None, [override]))
    message = str(info.value)
    assert message.startswith(field) and "\n" not in message


def test_config_group_size_must_fit_a_batch():
    with pytest.raises(ConfigError, match="^tasks.group_size"):
        load_config(None, ["buffer.sampling=group", "tasks.group_size=200", "buffer.batch_episodes=8"])


def test_group_size_has_one_home_the_tasks_table():
    with pytest.raises(ConfigError, match="^buffer.group_size: unknown field"):
        load_config(None, ["buffer.group_size=4"])


# ---- gate: blocking, unblocking, timeout, cancel ---------------------------------------------------------

async def test_gate_blocks_until_notified_with_a_result():
    gate, box = Gate(), []
    waiter = asyncio.create_task(gate.wait_for(lambda: box[0] if box else None))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    gate.notify()  # woken, but still nothing there: keeps waiting
    await asyncio.sleep(0.01)
    assert not waiter.done()
    box.append("batch")
    gate.notify()
    assert await asyncio.wait_for(waiter, 5) == "batch"


async def test_gate_cancel_unblocks_waiters():
    gate = Gate()
    waiters = [asyncio.create_task(gate.wait_for(lambda: None)) for _ in range(3)]
    await asyncio.sleep(0.01)
    gate.cancel()
    for w in waiters:
        with pytest.raises(Cancelled):
            await asyncio.wait_for(w, 5)


async def test_gate_times_out():
    with pytest.raises(TimeoutError):
        await Gate().wait_for(lambda: None, timeout_s=0.05)


def test_blocked_clock_accumulates_only_while_blocked():
    store = make_store()
    clock = BlockedClock(metrics_of(store).insert_blocked)
    clock.update(True, now=10.0)
    clock.update(True, now=12.0)
    clock.update(False, now=13.5)
    clock.update(False, now=20.0)
    assert metric(store, "turnstream_buffer_insert_blocked_seconds_total") == pytest.approx(3.5)
