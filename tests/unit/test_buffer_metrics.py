"""The buffer's /metrics: Prometheus naming (base units, _total counters, bounded labels) and liveness."""
from __future__ import annotations

import re

from turnstream.buffer.metrics import BufferMetrics
from tests.unit.test_store import ID, chunk, ingest, make_store, metric

BOUNDED_LABELS = {"outcome", "reason", "event", "state"}
BUILD_INFO = "turnstream_build_info"  # every role's shared gauge (core/build_info.py)


def test_names_units_and_labels_follow_prometheus_conventions():
    families = list(BufferMetrics().registry.collect())
    names = {f.name for f in families}
    for required in ("turnstream_buffer_items", "turnstream_buffer_inserts", "turnstream_buffer_samples",
                     "turnstream_buffer_dropped_episodes", "turnstream_buffer_served_staleness_versions",
                     "turnstream_buffer_insert_blocked_seconds", "turnstream_buffer_sample_blocked_seconds",
                     "turnstream_buffer_connected_actors"):
        assert required in names, required
    for family in families:
        if family.name == BUILD_INFO:
            continue
        assert re.fullmatch(r"turnstream_buffer_[a-z_]+", family.name), family.name
        assert not re.search(r"_(ms|milliseconds|kb|mb|minutes)$", family.name), "use base units"
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples), family.name
        for sample in family.samples:
            assert set(sample.labels) <= BOUNDED_LABELS | {"le"}, (family.name, sample.labels)


def test_connected_actors_counts_only_recent_heartbeats_and_silent_actors_expire():
    store = make_store(actor_timeout_s=5.0)
    store.admission.on_credit_request(b"x", "a0", 0, slots=2)
    store.admission.on_credit_request(b"y", "a1", 0, slots=2)
    store.grant_credits()
    now = store.admission.actors[("a0", 0)].last_seen
    store.admission.actors[("a1", 0)].last_seen = now - 10
    assert store.admission.connected(now) == 1
    store.expire(now)  # a1 is silent: its unused credits are reclaimed and it is forgotten
    assert ("a1", 0) not in store.admission.actors and ("a0", 0) in store.admission.actors
    assert metric(store, "turnstream_buffer_credits_reclaimed_total") == 2


def test_abandoned_episode_of_a_dead_actor_is_dropped_and_counted():
    store = make_store(episode_timeout_s=1.0, actor_timeout_s=1.0)
    ingest(store, ID, chunk(seq=0, ep="half"))
    later = store.in_progress["half"].last_seen + 2
    store.expire(later)
    assert not store.in_progress and store.running == 0
    assert metric(store, "turnstream_buffer_dropped_episodes_total", reason="abandoned") == 1
    store.expire(later)
    assert not store.admission.actors  # no running episode left: the dead actor is forgotten too
