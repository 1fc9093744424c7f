"""Replay store: idempotent ingest, episode assembly, serving under the staleness bound, expiry.

Pure logic without sockets, so every rule here is unit-testable. The server (buffer/server.py) feeds it
decoded messages and sends what it returns. What happens to chunks and episodes is announced to the
store's listeners as typed events (buffer/store/events.py): the write-ahead journal (buffer/durability/) logs
every change a restart must replay before it takes effect, so a restarted buffer rebuilds exactly this
state, and the metrics (buffer/store_metrics.py) and the audit trail (buffer/audit.py) count and note them.
Who may start an episode is admission's to decide (buffer/store/admission.py); what makes a chunk malformed,
validation's (buffer/store/validate.py).

Invariants:
- a chunk is ingested at most once per (actor_id, epoch, seq);
- an episode reaches the learner only when complete, at most once, and only if
  learner_version - min(token versions) <= max_staleness at the moment it is served;
- with segments (segment_turns > 0), an open episode's next turns may be served before it ends
  (buffer/store/episodes.py, Segment): each turn in at most one served item, the bound checked on the item's own
  turns, and the episode's staleness afterwards measured on its turns not yet served. A turn past the bound
  is skipped (counted, never served), not its episode: the later turns are fresh, and a value-based
  estimator trains them from the critic's bootstrap as any segment; a complete episode with nothing fresh
  left is dropped as stale;
- memory is bounded by max_items episodes: beyond it no credit is granted, so actors wait;
- episodes leave only by being served or by a counted drop (stale, abandoned, group_timeout, uniform_group);
- with positive replay (buffer/store/positive_replay.py), a served success on a hard task may be served again
  as a `Replay`, under the same bound, never consumed or sampled again;
- with critic replay (buffer/store/critic_replay.py), whole episodes served or dropped as stale may be served
  again as `CriticReplay` items, to the critic alone, under the critic's own bound: they are not policy data, so
  the policy's bound does not apply to them, and they are never consumed or sampled again.
"""
from __future__ import annotations

import heapq
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

from turnstream.buffer.acks import AckEntry
from turnstream.buffer.store.admission import Admission
from turnstream.buffer.store.dedup import SeqDeduper
from turnstream.buffer.store.critic_replay import CriticReplayPool
from turnstream.buffer.store.episodes import Episode, Item, Replay, Segment
from turnstream.buffer.store.events import (BatchServed, ChunkAccepted, ChunkDuplicate, ChunkRejected, ChunksArrived,
                                      EpisodeCompleted, EpisodesDropped, EpisodeStarted, Listeners, MessageRejected,
                                      TurnsSkipped, VersionAdvanced)
from turnstream.buffer.store.positive_replay import PositiveReplay
from turnstream.buffer.store.ratelimit import RateLimiter
from turnstream.buffer.store.sampling import incomplete_groups, select, uniform_groups
from turnstream.buffer.store.validate import rejections
from turnstream.protocol.chunk_batch import BatchError, unpack
from turnstream.protocol.messages import TurnChunk, TurnChunkBatch

log = logging.getLogger("turnstream.buffer")

MAX_CLOSED_IDS = 200_000


@dataclass
class StoreSnapshot:
    """What a compacted write-ahead log keeps of the store beside the live episodes: counters, dedup
    watermarks (SeqDeduper.snapshot) and the ids of closed episodes."""
    learner_version: int
    accepted: int
    inserts: int
    samples: int
    max_served_staleness: int
    dropped_since_batch: int
    dedup: list
    closed: list[str]


class ReplayStore:
    def __init__(self, *, batch_episodes: int, eta: int, max_staleness: int, max_running: int,
                 max_items: int, episode_timeout_s: float, actor_timeout_s: float,
                 policy: str = "fifo", group_size: int = 1, limiter: RateLimiter | None = None,
                 group_timeout_s: float = float("inf"), drop_uniform_groups: bool = False,
                 segment_turns: int = 0, segment_after_s: float = 0.0, positive: PositiveReplay | None = None,
                 critic: CriticReplayPool | None = None):
        self.max_staleness = max_staleness
        self.episode_timeout_s = episode_timeout_s
        self.policy, self.group_size, self.group_timeout_s = policy, group_size, group_timeout_s
        self.drop_uniform_groups = drop_uniform_groups and policy == "group"
        self.segment_turns, self.segment_after_s = segment_turns, segment_after_s
        self.limiter = limiter or RateLimiter()
        self.positive = positive
        self.critic = critic
        self.listeners = Listeners()
        self.admission = Admission(batch_episodes=batch_episodes, eta=eta, max_running=max_running,
                                   max_items=max_items, actor_timeout_s=actor_timeout_s, limiter=self.limiter,
                                   emit=self.listeners.emit)
        self.learner_version = 0
        self.max_served_staleness = 0
        self.dropped_since_batch = 0  # stale drops reported with the next batch
        self.in_progress: dict[str, Episode] = {}
        self.ready: OrderedDict[str, Episode] = OrderedDict()  # completion order
        self.dedup = SeqDeduper()
        self.closed: OrderedDict[str, None] = OrderedDict()

    # ---- admission (buffer/store/admission.py) -----------------------------------------------------------------
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
            self.listeners.emit(MessageRejected(exc.reason, len(msg.seq)))
            return [(seq, "rejected", exc.reason) for seq in msg.seq]
        announced = False
        entries = []
        for chunk, reason in zip(chunks, rejections(msg, chunks)):
            # announced just before the first chunk not seen before: an all-duplicate resend adds nothing
            if not announced and not self.dedup.seen((chunk.actor_id, chunk.epoch), chunk.seq):
                self.listeners.emit(ChunksArrived(msg, frames))
                announced = True
            entries.append((chunk.seq, *self._ingest_one(identity, chunk, reason)))
        return entries

    def _ingest_one(self, identity: bytes, chunk: TurnChunk, reason: str) -> tuple[str, str]:
        key = (chunk.actor_id, chunk.epoch)
        if self.dedup.seen(key, chunk.seq):
            self.listeners.emit(ChunkDuplicate(chunk))
            return "duplicate", ""
        reason = reason or self._conflict(chunk)
        self.dedup.add(key, chunk.seq)  # a resend of a bad chunk is still bad: do not count it twice
        if reason:
            self.listeners.emit(ChunkRejected(chunk, reason))
            return "rejected", reason
        self.listeners.emit(ChunkAccepted(chunk))
        completed = self._assemble(identity, chunk)
        if completed is not None:
            self._insert(completed)
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
    def _assemble(self, identity: bytes, chunk: TurnChunk) -> Episode | None:
        """Add the chunk's turn to its episode; returns the episode if this turn completed it (it is ready)."""
        key = (chunk.actor_id, chunk.epoch)
        actor = self.admission.heard_from(key, identity)
        ep = self.in_progress.get(chunk.episode_id)
        if ep is None:
            ep = self.in_progress[chunk.episode_id] = Episode(chunk.episode_id, key, chunk.prompt_key)
            self.listeners.emit(EpisodeStarted(chunk.episode_id, self.admission.start_episode(actor)))
        ep.add(chunk)
        if not ep.complete:
            return None
        self._close(ep)
        self.ready[ep.episode_id] = ep
        return ep

    def _insert(self, ep: Episode) -> None:
        """A newly completed episode enters the table: it holds admission room and counts as an insert."""
        self.listeners.emit(EpisodeCompleted(ep))
        self.admission.episode_accepted()
        self.limiter.on_insert()
        if self.positive is not None:
            self.positive.completed(ep)
        self._skip_stale_turns(ep)
        if self._is_stale(ep):
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
        self.listeners.emit(VersionAdvanced(version))
        self.learner_version = version
        # staleness grows only when the version moves, so this is the only scan needed
        if self.segment_turns:
            for ep in self.ready.values():
                self._skip_stale_turns(ep)
        stale = [i for i, ep in self.ready.items() if self._is_stale(ep)]
        if stale:
            self._drop_ready(stale, "stale")

    def _is_stale(self, item: Episode | Segment) -> bool:
        """Whether the item is past max_staleness. For a complete episode whose stale turns were skipped
        (segments), that is: nothing is left to train, as the turns it still has are all fresh."""
        return self.staleness(item) > self.max_staleness

    def _skip_stale_turns(self, ep: Episode) -> None:
        """With segments: pass over `ep`'s turns past the bound, as if served, so that its fresher turns can still
        be. Without segments an episode is trained whole or not at all: nothing to do."""
        if not self.segment_turns:
            return
        oldest = self.learner_version - self.max_staleness
        skip_to = ep.stale_through(oldest) if ep.min_version < oldest else ep.served
        if skip_to > ep.served:
            self.listeners.emit(TurnsSkipped(ep.episode_id, ep.served, skip_to))
            ep.serve_through(skip_to)

    def staleness(self, item: Item) -> int:
        """Versions between the learner and the oldest token of the item's turns not yet served."""
        return self.learner_version - item.behaviour_version

    def take_batch(self, learner_version: int, n: int, max_tokens: int = 0) -> tuple[list[Item], int] | None:
        """A batch by the sampling policy (at most n items, at most max_tokens), or None if not yet. Items are
        complete episodes and, with segments on, segments of open episodes, in the order they became ready; with
        positive replay, then the replays it holds; with critic replay, then the critic's episodes, on top of n."""
        self.set_learner_version(learner_version)
        for_critic = self.critic.due(n, self.learner_version) if self.critic is not None else []
        replays = self.positive.due(n, self.learner_version, self.max_staleness) if self.positive else []
        n -= len(replays)
        if max_tokens > 0 and replays:
            max_tokens = max(1, max_tokens - sum(r.num_tokens for r in replays))
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
            stale = [item.episode_id for item in batch if self._is_stale(item)]
            if not stale:
                break
            log.error("%d items past the staleness bound reached serving; their episodes dropped", len(stale))
            self.drop(stale, "stale")
        staleness = [self.staleness(item) for item in batch]
        self.max_served_staleness = max([self.max_served_staleness, *staleness, *map(self.staleness, replays)])
        # before anything leaves: once the journal holds this, a crash never serves these turns again
        kept = [item for item in batch if isinstance(item, Episode) and self.positive.worth_keeping(item)
                ] if self.positive is not None else []
        served = BatchServed(batch, staleness, self.learner_version, self.max_served_staleness,
                             len(batch) // self.group_size if self.policy == "group" else 0, replays,
                             [ep.episode_id for ep in kept], for_critic, self.max_staleness)
        self.listeners.emit(served)
        self._remove_ready(served.episode_ids)
        for item in batch:
            ep, _first, bootstrap = item.span
            if bootstrap >= 0:
                ep.serve_through(bootstrap)
        if self.positive is not None:
            self.positive.replayed(replays)
            self.positive.keep(kept)
        if self.critic is not None:
            self.critic.keep([item for item in batch if isinstance(item, Episode)])
        dropped, self.dropped_since_batch = self.dropped_since_batch, 0
        return [*batch, *replays, *for_critic], dropped

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

    # ---- restart from the write-ahead log (buffer/durability/journal.py) -------------------------------------
    def snapshot(self) -> StoreSnapshot:
        return StoreSnapshot(learner_version=self.learner_version, accepted=self.admission.accepted,
                             inserts=self.limiter.inserts, samples=self.limiter.samples,
                             max_served_staleness=self.max_served_staleness,
                             dropped_since_batch=self.dropped_since_batch, dedup=self.dedup.snapshot(),
                             closed=list(self.closed))

    def restore(self, snap: StoreSnapshot) -> None:
        """Start over from a compacted log's snapshot; its live episodes follow (restore_chunk)."""
        self.in_progress.clear()
        self.ready.clear()
        self.learner_version = snap.learner_version
        self.admission.restore_accepted(snap.accepted)
        self.limiter.inserts, self.limiter.samples = snap.inserts, snap.samples
        self.max_served_staleness = snap.max_served_staleness
        self.dropped_since_batch = snap.dropped_since_batch
        self.dedup = SeqDeduper.restore(snap.dedup)
        self.closed = OrderedDict.fromkeys(snap.closed)

    def restore_chunk(self, chunk: TurnChunk) -> None:
        """Put back a live chunk from a compacted log (replayed with the listeners muted); the counters and
        admission's count of accepted episodes come from the log's snapshot, not from here."""
        self._assemble(b"", chunk)

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
        self.listeners.emit(EpisodesDropped(ids, reason))
        if reason == "stale" and self.critic is not None:  # past the policy's bound, maybe not the critic's
            self.critic.keep([self.ready[i] for i in ids])
        self._remove_ready(ids)
        self.admission.episodes_dropped(len(ids))
        self.dropped_since_batch += len(ids)

    def drop(self, episode_ids: list[str], reason: str) -> None:
        """Close in-progress or ready episodes for a counted reason (also used by log replay)."""
        ready = [i for i in episode_ids if i in self.ready]
        if ready:
            self._drop_ready(ready, reason)
        running = [self.in_progress[i] for i in episode_ids if i in self.in_progress]
        if running:
            self.listeners.emit(EpisodesDropped([ep.episode_id for ep in running], reason))
            for ep in running:
                self._close(ep)

    # ---- expiry ------------------------------------------------------------------------------------------
    def expire(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        abandoned = [i for i, ep in self.in_progress.items() if now - ep.last_seen > self.episode_timeout_s]
        if abandoned:
            self.drop(abandoned, "abandoned")
        if not self.segment_turns:  # with segments an open episode's fresh turns can still be served
            # could never be served: free its slot now
            hopeless = [i for i, ep in self.in_progress.items() if ep.turns and self._is_stale(ep)]
            if hopeless:
                self.drop(hopeless, "stale")
        if self.policy == "group":
            orphans = incomplete_groups(self.ready, self.group_size, now - self.group_timeout_s)
            if orphans:
                self.drop(orphans, "group_timeout")
        self.admission.forget_silent(now)
