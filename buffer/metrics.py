"""Prometheus metrics of the buffer role, on a registry of its own (tests run several in one process)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class BufferMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        r = self.registry = registry or CollectorRegistry()
        self.chunks = Counter("turnstream_buffer_chunks_total", "Turn chunks received, by outcome",
                              ["outcome"], registry=r)
        self.rejected = Counter("turnstream_buffer_rejected_total", "Chunks or messages rejected, by reason",
                                ["reason"], registry=r)
        self.episodes = Counter("turnstream_buffer_episodes_total", "Episode lifecycle events",
                                ["event"], registry=r)
        self.dropped = Counter("turnstream_buffer_dropped_episodes_total", "Episodes dropped, by reason",
                               ["reason"], registry=r)
        self.tokens_ingested = Counter("turnstream_buffer_tokens_ingested_total", "Tokens ingested", registry=r)
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
