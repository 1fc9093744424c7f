"""The replay store's events counted into the buffer's Prometheus metrics (buffer/metrics.py): a store listener."""
from __future__ import annotations

import time

from turnstream.buffer.store.events import (BatchServed, ChunkAccepted, ChunkDuplicate, ChunkRejected, CreditsGranted,
                                      CreditsReclaimed, EpisodeCompleted, EpisodesDropped, EpisodeStarted,
                                      MessageRejected, StoreEvent, TurnsSkipped)
from turnstream.buffer.metrics import BufferMetrics
from turnstream.buffer.store.replay_store import ReplayStore


class StoreMetrics:
    def __init__(self, metrics: BufferMetrics):
        self.metrics = metrics

    def on_event(self, event: StoreEvent) -> None:
        m = self.metrics
        counts = m.counts
        match event:  # the per-chunk events first: they are the most frequent
            case ChunkAccepted(chunk=chunk):
                counts.chunks["ok"] += 1
                counts.tokens_ingested += chunk.obs_tokens.size + chunk.gen_tokens.size
            case ChunkDuplicate():
                counts.chunks["duplicate"] += 1
            case ChunkRejected(reason=reason):
                counts.chunks["rejected"] += 1
                m.rejected.labels(reason).inc()
            case MessageRejected(reason=reason, chunks=n):
                m.rejected.labels(reason).inc()
                counts.chunks["rejected"] += n
            case EpisodeStarted(used_credit=used_credit):
                counts.episodes["started"] += 1
                if not used_credit:
                    counts.episodes["started_without_credit"] += 1
            case EpisodeCompleted():
                counts.inserts += 1
                counts.episodes["completed"] += 1
            case EpisodesDropped(episode_ids=ids, reason=reason):
                m.dropped.labels(reason).inc(len(ids))
            case TurnsSkipped(first=first, end=end):
                m.stale_turns_skipped.inc(end - first)
            case BatchServed():
                self._served(event)
            case CreditsGranted(credits=n):
                m.credits_granted.inc(n)
            case CreditsReclaimed(credits=n):
                m.credits_reclaimed.inc(n)

    def _served(self, event: BatchServed) -> None:
        m, now = self.metrics, time.monotonic()
        for item, staleness in zip(event.items, event.staleness):
            ep, first, bootstrap = item.span
            m.served_staleness.observe(staleness)
            m.observe_turn_latency(ep, range(first, ep.last_turn + 1 if bootstrap < 0 else bootstrap), now,
                                   event.learner_version)
        whole = len(event.episode_ids)
        m.max_staleness_served.set(event.max_served_staleness)
        m.counts.episodes["served"] += whole
        m.counts.episodes["replayed"] += len(event.replays)
        m.counts.episodes["kept_for_replay"] += len(event.kept_for_replay)
        if event.for_critic:
            within, beyond = event.critic_turns()
            m.counts.episodes["critic_replayed"] += len(event.for_critic)
            m.counts.critic_turns["within_bound"] += within
            m.counts.critic_turns["beyond_bound"] += beyond
        m.segments_served.inc(len(event.items) - whole)
        m.samples.inc(len(event.items))
        m.groups_served.inc(event.groups)


def meter(store: ReplayStore, metrics: BufferMetrics) -> None:
    """Count `store`'s events into `metrics`, whose state gauges read the store when scraped."""
    store.listeners.add(StoreMetrics(metrics))
    metrics.watch(store)
