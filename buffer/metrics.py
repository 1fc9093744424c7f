"""Prometheus metrics of the buffer role, on a registry of its own (tests run several in one process)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily

from turnstream.core.build_info import register_build_info


class BufferMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        r = self.registry = registry or CollectorRegistry()
        register_build_info(r, "buffer")
        self.rejected = Counter("turnstream_buffer_rejected_total", "Chunks or messages rejected, by reason",
                                ["reason"], registry=r)
        self.dropped = Counter("turnstream_buffer_dropped_episodes_total", "Episodes dropped, by reason",
                               ["reason"], registry=r)
        self.credits_granted = Counter("turnstream_buffer_credits_granted_total", "Episode credits granted",
                                       registry=r)
        self.credits_reclaimed = Counter("turnstream_buffer_credits_reclaimed_total",
                                         "Unused credits taken back from silent actors", registry=r)
        self.batches = Counter("turnstream_buffer_batches_served_total", "Batches served", registry=r)
        self.served_staleness = Histogram("turnstream_buffer_served_staleness_versions",
                                          "Staleness of served episodes in policy versions",
                                          buckets=(0, 1, 2, 3, 4, 6, 8, 16), registry=r)
        self.max_staleness_served = Gauge("turnstream_buffer_max_served_staleness_versions",
                                          "Largest staleness ever served", registry=r)
        self.ready_episodes = Gauge("turnstream_buffer_ready_episodes", "Complete episodes waiting", registry=r)
        self.running_episodes = Gauge("turnstream_buffer_running_episodes",
                                      "Episodes in flight, including unused credits", registry=r)
        self.learner_version = Gauge("turnstream_buffer_learner_version", "Latest learner version seen",
                                     registry=r)
        self.actors = Gauge("turnstream_buffer_actors", "Actors known to the buffer", registry=r)
        self.connected_actors = Gauge("turnstream_buffer_connected_actors",
                                      "Actors heard from within buffer.actor_timeout_s", registry=r)
        self.items = Gauge("turnstream_buffer_items", "Episodes held, by state (memory bound: max_items)",
                           ["state"], registry=r)
        self.kept_for_replay = Gauge("turnstream_buffer_kept_for_replay_episodes",
                                     "Successes on hard tasks held to be served again (buffer.positive_replay)",
                                     registry=r)
        self.samples = Counter("turnstream_buffer_samples_total", "Episodes handed to the learner", registry=r)
        self.groups_served = Counter("turnstream_buffer_groups_served_total",
                                     "Complete groups of tasks.group_size episodes handed to the learner "
                                     "(buffer.sampling = group)", registry=r)
        self.segments_served = Counter("turnstream_buffer_segments_served_total",
                                       "Segments of open episodes handed to the learner (buffer.segment_turns)",
                                       registry=r)
        self.stale_turns_skipped = Counter("turnstream_buffer_stale_turns_skipped_total",
                                           "Turns of episodes served in segments passed over for being past "
                                           "buffer.max_staleness (their episode's fresher turns are still served)",
                                           registry=r)
        self.turn_to_train_seconds = Histogram(
            "turnstream_buffer_turn_to_train_seconds",
            "Per trained turn: seconds from its chunk's arrival to the batch holding it leaving for the learner",
            buckets=(0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128), registry=r)
        self.turn_to_train_versions = Histogram(
            "turnstream_buffer_turn_to_train_versions",
            "Per trained turn: learner version when served minus the version of its oldest generated token",
            buckets=(0, 1, 2, 3, 4, 6, 8, 16), registry=r)
        self.insert_blocked = Counter("turnstream_buffer_insert_blocked_seconds_total",
                                      "Seconds actors wanted credit but admission, memory or the rate limiter "
                                      "said no", registry=r)
        self.sample_blocked = Counter("turnstream_buffer_sample_blocked_seconds_total",
                                      "Seconds a learner request waited for data or the rate limiter", registry=r)
        self.auth_failures = Counter("turnstream_buffer_auth_failures_total",
                                     "Peers refused by CURVE: reason auth = key not on the allow-list, "
                                     "protocol or no_detail = bad handshake (e.g. a plaintext peer)",
                                     ["socket", "reason"], registry=r)
        self.batch_requests = Counter("turnstream_buffer_batch_requests_total", "Batch requests, by outcome",
                                      ["outcome"], registry=r)
        self.wal_bytes = Gauge("turnstream_buffer_wal_bytes", "Size of the write-ahead log", registry=r)
        self.wal_appended = Counter("turnstream_buffer_wal_appended_bytes_total", "Bytes appended to the log",
                                    registry=r)
        self.wal_fsyncs = Counter("turnstream_buffer_wal_fsyncs_total", "fsync calls on the log", registry=r)
        self.wal_compactions = Counter("turnstream_buffer_wal_compactions_total", "Log compactions", registry=r)
        self.wal_replayed = Counter("turnstream_buffer_wal_replayed_records_total",
                                    "Log records replayed at start-up", registry=r)
        self.wal_torn = Counter("turnstream_buffer_wal_torn_bytes_total",
                                "Bytes of an unfinished last record cut off at start-up", registry=r)
        self.counts = IngestCounts()
        r.register(self.counts)

    def observe_turn_latency(self, episode, turns: range, now: float, learner_version: int) -> None:
        """Turn-to-train latency of an episode's `turns` (a buffer.episodes.Episode), served at `now`."""
        for t in turns:
            self.turn_to_train_seconds.observe(now - episode.arrived[t])
            versions = episode.turns[t].gen_versions
            if versions.size:
                self.turn_to_train_versions.observe(learner_version - int(versions.min()))

    def watch(self, store) -> None:
        """The state gauges read `store` (a buffer.store.ReplayStore) when scraped, instead of being set on every
        change, on the path every message takes. Scrapes run on the buffer's event loop (protocol/http_metrics.py),
        the thread that changes the store."""
        self.ready_episodes.set_function(lambda: len(store.ready))
        self.running_episodes.set_function(lambda: store.running)
        self.items.labels("ready").set_function(lambda: len(store.ready))
        self.items.labels("running").set_function(lambda: store.running)
        self.learner_version.set_function(lambda: store.learner_version)
        self.actors.set_function(lambda: len(store.admission.actors))
        self.connected_actors.set_function(store.admission.connected)
        if store.positive is not None:
            self.kept_for_replay.set_function(lambda: len(store.positive.kept))


class IngestCounts:
    """The counters of the per-chunk path, kept as plain ints and read at scrape time: a prometheus_client
    Counter takes a lock on every increment, a large share of the store's ingest time. Their only writer is
    the store's metrics listener (buffer/store_metrics.py), on the buffer's event loop."""

    def __init__(self):
        self.chunks = dict.fromkeys(("ok", "duplicate", "rejected"), 0)  # by outcome
        # by event; replayed: served again by buffer.positive_replay, kept_for_replay: a success it will serve again,
        # critic_replayed: served again to the critic alone (buffer.critic_replay)
        self.episodes = dict.fromkeys(("started", "started_without_credit", "completed", "served", "replayed",
                                       "kept_for_replay", "critic_replayed"), 0)
        # turns of critic-only episodes, by whether they are within the policy's staleness bound or past it
        self.critic_turns = dict.fromkeys(("within_bound", "beyond_bound"), 0)
        self.tokens_ingested = 0
        self.inserts = 0

    def describe(self):
        return self.collect()

    def collect(self):
        chunks = CounterMetricFamily("turnstream_buffer_chunks", "Turn chunks received, by outcome",
                                     labels=["outcome"])
        for outcome, n in self.chunks.items():
            chunks.add_metric([outcome], n)
        episodes = CounterMetricFamily("turnstream_buffer_episodes", "Episode lifecycle events", labels=["event"])
        for event, n in self.episodes.items():
            episodes.add_metric([event], n)
        critic_turns = CounterMetricFamily(
            "turnstream_buffer_critic_turns", "Turns served to the critic alone (buffer.critic_replay), by whether "
            "the policy's staleness bound would have dropped them", labels=["state"])
        for state, n in self.critic_turns.items():
            critic_turns.add_metric([state], n)
        return [chunks, episodes, critic_turns,
                CounterMetricFamily("turnstream_buffer_tokens_ingested", "Tokens ingested",
                                    value=self.tokens_ingested),
                CounterMetricFamily("turnstream_buffer_inserts", "Complete episodes inserted into the table",
                                    value=self.inserts)]

