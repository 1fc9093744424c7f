"""Replay store: idempotent ingest, episode assembly, serving under the staleness bound, expiry.

Pure logic without sockets, so every rule here is unit-testable. The server (buffer/server.py) feeds it
decoded messages and sends what it returns; a journal (buffer/journal.py), when attached, is told every
state change before it takes effect, so a restarted buffer can rebuild exactly this state. Who may start
an episode is admission's to decide (buffer/admission.py); what makes a chunk malformed, validation's
(buffer/validate.py).

Invariants:
- a chunk is ingested at most once per (actor_id, epoch, seq);
- an episode reaches the learner only when complete, at most once, and only if
  learner_version - min(token versions) <= max_staleness at the moment it is served;
- with segments (segment_turns > 0), an open episode's next turns may be served before it ends
  (buffer/episodes.py, Segment): each turn in at most one served item, the bound checked on the item's own
  turns, and the episode's staleness afterwards measured on its turns not yet served. A turn past the bound
  is skipped (counted, never served), not its episode: the later turns are fresh, and a value-based
  estimator trains them from the critic's bootstrap as any segment; a complete episode with nothing fresh
  left is dropped as stale;
- memory is bounded by max_items episodes: beyond it no credit is granted, so actors wait;
- episodes leave only by being served or by a counted drop (stale, abandoned, group_timeout, uniform_group).
"""
from __future__ import annotations

import heapq
import logging
import time
from collections import OrderedDict
from typing import Protocol

from turnstream.buffer.acks import AckEntry
from turnstream.buffer.admission import Admission
from turnstream.buffer.dedup import SeqDeduper
from turnstream.buffer.episodes import Episode, Segment
from turnstream.buffer.metrics import BufferMetrics
from turnstream.buffer.ratelimit import RateLimiter
from turnstream.buffer.sampling import incomplete_groups, select, uniform_groups
from turnstream.buffer.validate import rejections
from turnstream.protocol.chunk_batch import BatchError, unpack
from turnstream.protocol.codec import encode
from turnstream.protocol.messages import TurnChunk, TurnChunkBatch

log = logging.getLogger("turnstream.buffer")

MAX_CLOSED_IDS = 200_000


class Journal(Protocol):
    def chunks(self, frames: list) -> None: ...
    def consumed(self, episode_ids: list[str]) -> None: ...
    def segment(self, episode_id: str, first: int, end: int) -> None: ...
    def closed(self, episode_ids: list[str], reason: str) -> None: ...
    def version(self, version: int) -> None: ...


class ReplayStore:
    def __init__(self, *, batch_episodes: int, eta: int, max_staleness: int, max_running: int,
                 max_items: int, episode_timeout_s: float, actor_timeout_s: float, metrics: BufferMetrics,
                 policy: str = "fifo", group_size: int = 1, limiter: RateLimiter | None = None,
                 group_timeout_s: float = float("inf"), drop_uniform_groups: bool = False,
                 segment_turns: int = 0, segment_after_s: float = 0.0):
        self.max_staleness = max_staleness
        self.episode_timeout_s = episode_timeout_s
        self.policy, self.group_size, self.group_timeout_s = policy, group_size, group_timeout_s
        self.drop_uniform_groups = drop_uniform_groups and policy == "group"
        self.segment_turns, self.segment_after_s = segment_turns, segment_after_s
        self.limiter = limiter or RateLimiter()
        self.m = metrics
        self.admission = Admission(batch_episodes=batch_episodes, eta=eta, max_running=max_running,
                                   max_items=max_items, actor_timeout_s=actor_timeout_s, limiter=self.limiter,
                                   metrics=metrics)
        self.journal: Journal | None = None
        self.learner_version = 0
        self.max_served_staleness = 0
        self.dropped_since_batch = 0  # stale drops reported with the next batch
        self.in_progress: dict[str, Episode] = {}
        self.ready: OrderedDict[str, Episode] = OrderedDict()  # completion order
        self.dedup = SeqDeduper()
        self.closed: OrderedDict[str, None] = OrderedDict()
        metrics.watch(self)

    # ---- admission (buffer/admission.py) -----------------------------------------------------------------
    @property
    def running(self) -> int:
        """Episodes admitted and not yet complete: unused credits and episodes in progress."""
        return self.admission.unused_credits() + len(self.in_progress)

    def capacity(self) -> int:
        return self.admission.capacity(in_progress=len(self.in_progress), ready=len(self.ready),
                                       learner_version=self.learner_version)

    def grant_credits(self) -> list[tuple[bytes, int]]:
        return self.admission.grant(self.capacity())

    # ---- ingest ------------------------------------------------------------------------------------------
    def ingest_message(self, identity: bytes, msg: TurnChunkBatch, frames: list | None = None) -> list[AckEntry]:
        """Apply an actor's message: each of its chunks in order, once. Returns each chunk's (seq, status,
        reason), status "ok", "duplicate" or "rejected"; a batch whose columns disagree is rejected whole.

        `frames` are what the message arrived as: the journal stores them once, before any chunk takes effect
        (replay applies them again, and ingest decides the same way on the same state)."""
        try:
            chunks = unpack(msg)
        except BatchError as exc:
            self.m.rejected.labels(exc.reason).inc()
            self.m.counts.chunks["rejected"] += len(msg.seq)
            return [(seq, "rejected", exc.reason) for seq in msg.seq]
        journaled = self.journal is None
        entries = []
        for chunk, reason in zip(chunks, rejections(msg, chunks)):
            # logged just before the first chunk that is not a duplicate: all-duplicate resends add nothing
            if not journaled and not self.dedup.seen((chunk.actor_id, chunk.epoch), chunk.seq):
                self.journal.chunks(frames if frames is not None else encode(msg))
                journaled = True
            entries.append((chunk.seq, *self._ingest_one(identity, chunk, reason)))
        return entries

    def _ingest_one(self, identity: bytes, chunk: TurnChunk, reason: str) -> tuple[str, str]:
        key = (chunk.actor_id, chunk.epoch)
        if self.dedup.seen(key, chunk.seq):
            self.m.counts.chunks["duplicate"] += 1
            return "duplicate", ""
        reason = reason or self._conflict(chunk)
        self.dedup.add(key, chunk.seq)  # a resend of a bad chunk is still bad: do not count it twice
        if reason:
            self.m.counts.chunks["rejected"] += 1
            self.m.rejected.labels(reason).inc()
            return "rejected", reason
        self._assemble(identity, chunk, counted=True)
        counts = self.m.counts
        counts.chunks["ok"] += 1
        counts.tokens_ingested += chunk.obs_tokens.size + chunk.gen_tokens.size
        return "ok", ""

    def _conflict(self, chunk: TurnChunk) -> str:
        """Why a well-formed chunk does not fit its episode, or ""."""
        if chunk.episode_id in self.closed:
            return "episode_closed"
        ep = self.in_progress.get(chunk.episode_id)
        if ep is None:
            return ""
        if ep.actor_key != (chunk.actor_id, chunk.epoch) or chunk.turn in ep.turns:
            return "episode_conflict"
        return "turn_after_done" if ep.beyond_final_turn(chunk) else ""

    # ---- episode assembly --------------------------------------------------------------------------------
    def restore_chunk(self, chunk: TurnChunk) -> None:
        """Put back a live chunk from a compacted log; counters come from the snapshot, not from here."""
        self._assemble(b"", chunk, counted=False)

    def _assemble(self, identity: bytes, chunk: TurnChunk, *, counted: bool) -> None:
        key = (chunk.actor_id, chunk.epoch)
        actor = self.admission.heard_from(key, identity)
        ep = self.in_progress.get(chunk.episode_id)
        if ep is None:
            ep = self.in_progress[chunk.episode_id] = Episode(chunk.episode_id, key, chunk.prompt_key)
            used_credit = self.admission.start_episode(actor)
            if counted:
                self.m.counts.episodes["started"] += 1
                if not used_credit:
                    self.m.counts.episodes["started_without_credit"] += 1
        ep.add(chunk)
        if not ep.complete:
            return
        self._close(ep)
        self.ready[ep.episode_id] = ep
        if counted:
            self.admission.accepted += 1
            self.limiter.on_insert()
            self.m.counts.inserts += 1
            self.m.counts.episodes["completed"] += 1
            if self._past_the_bound(ep):
                self._drop_ready([ep.episode_id], "stale")  # finished already too old to ever be served

    def _close(self, ep: Episode) -> None:
        self.in_progress.pop(ep.episode_id, None)
        self.admission.end_episode(ep.actor_key)
        self.closed[ep.episode_id] = None
        while len(self.closed) > MAX_CLOSED_IDS:
            self.closed.popitem(last=False)

    # ---- staleness and serving ---------------------------------------------------------------------------
    def set_learner_version(self, version: int) -> None:
        if version <= self.learner_version:
            return
        if self.journal is not None:
            self.journal.version(version)
        self.learner_version = version
        # staleness grows only when the version moves, so this is the only scan needed
        stale = [i for i, ep in self.ready.items() if self._past_the_bound(ep)]
        if stale:
            self._drop_ready(stale, "stale")

    def _past_the_bound(self, ep: Episode) -> bool:
        """Whether a complete episode is past max_staleness with nothing left to train; with segments its stale
        turns are skipped first and its fresh ones kept."""
        return self.staleness(ep) > self.max_staleness and not self._skip_stale_turns(ep)

    def _skip_stale_turns(self, ep: Episode) -> bool:
        """With segments: pass over `ep`'s turns past the bound, as if served (journaled so, counted); whether it
        still has a turn to train. Without segments an episode is trained whole or not at all: False."""
        if not self.segment_turns:
            return False
        oldest = self.learner_version - self.max_staleness
        skip_to = ep.stale_through(oldest) if ep.min_version < oldest else ep.served
        if skip_to > ep.served:
            if self.journal is not None:
                self.journal.segment(ep.episode_id, ep.served, skip_to)
            self.m.stale_turns_skipped.inc(skip_to - ep.served)
            ep.serve_through(skip_to)
        return ep.has_turns_to_train()

    def staleness(self, item: Episode | Segment) -> int:
        """Versions between the learner and the oldest token of the item's turns not yet served."""
        return self.learner_version - item.behaviour_version

    def take_batch(self, learner_version: int, n: int, max_tokens: int = 0
                   ) -> tuple[list[Episode | Segment], int] | None:
        """A batch by the sampling policy (at most n items, at most max_tokens), or None if not yet. Items are
        complete episodes and, with segments on, segments of open episodes, in the order they became ready."""
        self.set_learner_version(learner_version)
        if self.drop_uniform_groups:
            uniform = uniform_groups(self.ready, self.group_size)
            if uniform:
                self._drop_ready(uniform, "uniform_group")
        while True:
            candidates = self._with_open_segments() if self.segment_turns else self.ready
            batch = select(self.policy, candidates, max_episodes=n, max_tokens=max_tokens,
                           group_size=self.group_size)
            # the rate limiter counts whole episodes (inserted when complete); segments ride along
            n_whole = sum(isinstance(item, Episode) for item in batch or ())
            if batch is None or not self.limiter.can_sample(n_whole, len(candidates)):
                return None
            # The bound is the store's promise, so it is checked where episodes leave, not only where the
            # version moves: an item past it is dropped, counted, and never served.
            stale = [item.episode_id for item in batch if self.staleness(item) > self.max_staleness]
            if not stale:
                break
            log.error("%d items past the staleness bound reached serving; their episodes dropped", len(stale))
            self.drop(stale, "stale")
        self._log_served(batch)
        whole = [item.episode_id for item in batch if isinstance(item, Episode)]
        self._remove_ready(whole)
        now = time.monotonic()
        for item in batch:
            ep, first, bootstrap = item.span
            s = self.staleness(item)
            self.m.served_staleness.observe(s)
            self.max_served_staleness = max(self.max_served_staleness, s)
            self.m.observe_turn_latency(ep, range(first, ep.last_turn + 1 if bootstrap < 0 else bootstrap), now,
                                        self.learner_version)
            if bootstrap >= 0:
                ep.serve_through(bootstrap)
        self.m.max_staleness_served.set(self.max_served_staleness)
        self.m.counts.episodes["served"] += len(whole)
        self.m.segments_served.inc(len(batch) - len(whole))
        self.m.samples.inc(len(batch))
        if self.policy == "group":
            self.m.groups_served.inc(len(batch) // self.group_size)
        dropped, self.dropped_since_batch = self.dropped_since_batch, 0
        return batch, dropped

    def _log_served(self, batch: list[Episode | Segment]) -> None:
        """Before anything leaves: a crash after this never serves it again."""
        if self.journal is None:
            return
        self.journal.consumed([item.episode_id for item in batch if isinstance(item, Episode)])
        for item in batch:
            if isinstance(item, Segment):
                self.journal.segment(item.episode_id, item.first, item.end)

    def _with_open_segments(self, now: float | None = None) -> OrderedDict[str, Episode | Segment]:
        """The ready episodes and the segments open episodes could serve now, by the time each became ready."""
        now = time.monotonic() if now is None else now
        segments = []
        for ep in self.in_progress.values():
            self._skip_stale_turns(ep)  # an open episode waits for fresh turns: it is never dropped as stale
            end = ep.segment_end()
            if end is None:
                continue
            if end - ep.served >= self.segment_turns:
                segments.append(Segment(ep, ep.served, end, ep.arrived[end]))
            elif self.segment_after_s and now - ep.arrived[ep.served] >= self.segment_after_s:
                segments.append(Segment(ep, ep.served, end, ep.arrived[ep.served] + self.segment_after_s))
        if not segments:
            return self.ready
        segments.sort(key=lambda seg: seg.ready_at)
        merged = heapq.merge(self.ready.values(), segments, key=lambda item: item.ready_at)
        return OrderedDict((item.episode_id, item) for item in merged)

    def mark_segment_served(self, episode_id: str, end: int) -> None:
        """Replay of a served segment: its turns are not served again."""
        ep = self.in_progress.get(episode_id) or self.ready.get(episode_id)
        if ep is not None:
            ep.serve_through(end)

    def mark_consumed(self, episode_ids: list[str]) -> None:
        """Replay of a served batch: those episodes are gone for good."""
        self._remove_ready([i for i in episode_ids if i in self.ready])

    def _remove_ready(self, ids: list[str]) -> None:
        for i in ids:
            del self.ready[i]
        self.limiter.on_sample(len(ids))

    def _drop_ready(self, ids: list[str], reason: str) -> None:
        if self.journal is not None:
            self.journal.closed(ids, reason)
        self._remove_ready(ids)
        self.admission.accepted -= len(ids)  # frees admission room
        self.dropped_since_batch += len(ids)
        self.m.dropped.labels(reason).inc(len(ids))

    def drop(self, episode_ids: list[str], reason: str) -> None:
        """Close in-progress or ready episodes for a counted reason (also used by log replay)."""
        ready = [i for i in episode_ids if i in self.ready]
        if ready:
            self._drop_ready(ready, reason)
        running = [self.in_progress[i] for i in episode_ids if i in self.in_progress]
        if running and self.journal is not None:
            self.journal.closed([ep.episode_id for ep in running], reason)
        for ep in running:
            self._close(ep)
        if running:
            self.m.dropped.labels(reason).inc(len(running))

    # ---- expiry ------------------------------------------------------------------------------------------
    def expire(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        abandoned = [i for i, ep in self.in_progress.items() if now - ep.last_seen > self.episode_timeout_s]
        if abandoned:
            self.drop(abandoned, "abandoned")
        if not self.segment_turns:  # with segments an open episode's fresh turns can still be served
            # could never be served: free its slot now
            hopeless = [i for i, ep in self.in_progress.items() if ep.turns and self.staleness(ep) > self.max_staleness]
            if hopeless:
                self.drop(hopeless, "stale")
        if self.policy == "group":
            orphans = incomplete_groups(self.ready, self.group_size, now - self.group_timeout_s)
            if orphans:
                self.drop(orphans, "group_timeout")
        self.admission.forget_silent(now)
