"""Replay store: idempotent ingest, episode assembly, AReaL admission control and the staleness bound.

Pure logic without sockets, so every rule here is unit-testable. The server (buffer/server.py) feeds it
decoded messages and sends what it returns; a journal (buffer/journal.py), when attached, is told every
state change before it takes effect, so a restarted buffer can rebuild exactly this state.

Invariants:
- a chunk is ingested at most once per (actor_id, epoch, seq);
- an episode reaches the learner only when complete, at most once, and only if
  learner_version - min(token versions) <= max_staleness at the moment it is served;
- memory is bounded by max_items episodes: beyond it no credit is granted, so actors wait;
- episodes leave only by being served or by a counted drop (stale, abandoned).
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol

from turnstream.buffer.dedup import SeqDeduper
from turnstream.buffer.episodes import Episode
from turnstream.buffer.metrics import BufferMetrics
from turnstream.buffer.ratelimit import RateLimiter
from turnstream.buffer.sampling import select
from turnstream.buffer.validate import beyond_final_turn, validate_chunk
from turnstream.protocol.codec import encode
from turnstream.protocol.messages import TurnChunk

MAX_CLOSED_IDS = 200_000


class Journal(Protocol):
    def chunks(self, frames: list) -> None: ...
    def consumed(self, episode_ids: list[str]) -> None: ...
    def closed(self, episode_ids: list[str], reason: str) -> None: ...
    def version(self, version: int) -> None: ...


@dataclass
class ActorState:
    identity: bytes
    slots: int = 0
    outstanding: int = 0  # credits granted but not yet used to start an episode
    running: int = 0  # started, not yet complete
    last_seen: float = field(default_factory=time.monotonic)


class ReplayStore:
    def __init__(self, *, batch_episodes: int, eta: int, max_staleness: int, max_running: int,
                 max_items: int, episode_timeout_s: float, actor_timeout_s: float, metrics: BufferMetrics,
                 policy: str = "fifo", group_size: int = 1, limiter: RateLimiter | None = None,
                 group_timeout_s: float = float("inf")):
        self.batch_episodes = batch_episodes
        self.eta = eta
        self.max_staleness = max_staleness
        self.max_running = max_running
        self.max_items = max_items
        self.episode_timeout_s = episode_timeout_s
        self.actor_timeout_s = actor_timeout_s
        self.policy, self.group_size, self.group_timeout_s = policy, group_size, group_timeout_s
        self.limiter = limiter or RateLimiter()
        self.m = metrics
        self.journal: Journal | None = None
        self.learner_version = 0
        self.max_served_staleness = 0
        self.accepted = 0  # completed episodes that were not later dropped
        self.dropped_since_batch = 0  # stale drops reported with the next batch
        self.in_progress: dict[str, Episode] = {}
        self.ready: OrderedDict[str, Episode] = OrderedDict()  # completion order
        self.actors: dict[tuple[str, int], ActorState] = {}
        self.dedup = SeqDeduper()
        self.closed: OrderedDict[str, None] = OrderedDict()
        self._grant_turn = 0  # rotates where grant_credits starts sharing
        self._bind_gauges()

    # ---- admission -------------------------------------------------------------------------
    @property
    def running(self) -> int:
        return sum(a.outstanding for a in self.actors.values()) + len(self.in_progress)

    def capacity(self) -> int:
        """AReaL: min(max_running - running, (eta + v + 1) * B - (accepted + running)), memory, rate limit."""
        running = self.running
        staleness_room = (self.eta + self.learner_version + 1) * self.batch_episodes - (self.accepted + running)
        memory_room = self.max_items - (running + len(self.ready))
        return max(0, min(self.max_running - running, staleness_room, memory_room,
                          self.limiter.insert_room(running)))

    def on_credit_request(self, identity: bytes, actor_id: str, epoch: int, slots: int) -> None:
        key = (actor_id, epoch)
        state = self.actors.setdefault(key, ActorState(identity=identity))
        state.identity, state.slots, state.last_seen = identity, max(0, slots), time.monotonic()

    def wanted_credits(self) -> int:
        return sum(max(0, a.slots - a.outstanding - a.running) for a in self.actors.values())

    def grant_credits(self) -> list[tuple[bytes, int]]:
        """Share the free capacity one credit at a time round the actors that want some, starting after the
        actor that got the last credit last time: first-come order would let fast actors starve a late one."""
        wanting = [a for a in self.actors.values() if a.slots - a.outstanding - a.running > 0]
        room = self.capacity()
        if not wanting or room <= 0:
            return []
        start = self._grant_turn % len(wanting)
        order = wanting[start:] + wanting[:start]
        given = {id(a): 0 for a in order}
        while room > 0 and order:
            still = []
            for a in order:
                if room == 0:
                    break
                a.outstanding += 1
                given[id(a)] += 1
                room -= 1
                self._grant_turn += 1
                if a.slots - a.outstanding - a.running > 0:
                    still.append(a)
            order = still if room else []
        grants = [(a.identity, given[id(a)]) for a in wanting if given[id(a)]]
        self.m.credits_granted.inc(sum(n for _, n in grants))
        return grants

    # ---- ingest ----------------------------------------------------------------------------
    def ingest(self, identity: bytes, chunk: TurnChunk, raw: list | None = None) -> tuple[str, str]:
        """Returns (status, reason): ("ok", ""), ("duplicate", "") or ("rejected", reason)."""
        return self.ingest_many(identity, [chunk], raw)[0]

    def ingest_many(self, identity: bytes, chunks: list[TurnChunk], raw: list | None = None, *,
                    prevalidated: bool = False) -> list[tuple[str, str]]:
        """Ingest the chunks of one message, in order; one (status, reason) per chunk.

        `raw` are the frames the message arrived in: the journal stores them once, before any chunk takes
        effect (replay re-ingests them, and ingest decides the same way on the same state).
        `prevalidated`: validate.batch_is_clean already passed for these chunks."""
        journaled = self.journal is None
        results = []
        for c in chunks:
            # logged just before the first chunk that is not a duplicate: all-duplicate resends add nothing
            if not journaled and not self.dedup.seen((c.actor_id, c.epoch), c.seq):
                self.journal.chunks(raw if raw is not None else encode(chunks[0]))
                journaled = True
            results.append(self._ingest_one(identity, c, prevalidated))
        return results

    def _ingest_one(self, identity: bytes, chunk: TurnChunk, prevalidated: bool) -> tuple[str, str]:
        key = (chunk.actor_id, chunk.epoch)
        if self.dedup.seen(key, chunk.seq):
            self.m.counts.chunks["duplicate"] += 1
            return "duplicate", ""
        reason = "" if prevalidated and not chunk.allowed_tokens.size else validate_chunk(chunk)
        if not reason and chunk.episode_id in self.closed:
            reason = "episode_closed"
        ep = self.in_progress.get(chunk.episode_id)
        if not reason and ep is not None and (ep.actor_key != key or chunk.turn in ep.turns):
            reason = "episode_conflict"
        if not reason and ep is not None and beyond_final_turn(ep, chunk):
            reason = "turn_after_done"
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

    def restore_chunk(self, chunk: TurnChunk) -> None:
        """Put back a live chunk from a compacted log; counters come from the snapshot, not from here."""
        self._assemble(b"", chunk, counted=False)

    def _assemble(self, identity: bytes, chunk: TurnChunk, *, counted: bool) -> None:
        key = (chunk.actor_id, chunk.epoch)
        actor = self.actors.get(key)
        if actor is None:
            actor = self.actors[key] = ActorState(identity=identity)
        actor.last_seen = time.monotonic()
        ep = self.in_progress.get(chunk.episode_id)
        if ep is None:
            ep = Episode(chunk.episode_id, key, chunk.prompt_key)
            self.in_progress[chunk.episode_id] = ep
            if actor.outstanding > 0:
                actor.outstanding -= 1
            elif counted:
                self.m.counts.episodes["started_without_credit"] += 1
            actor.running += 1
            if counted:
                self.m.counts.episodes["started"] += 1
        ep.add(chunk)
        if not ep.complete:
            return
        self._close(ep)
        self.ready[ep.episode_id] = ep
        if counted:
            self.accepted += 1
            self.limiter.on_insert()
            self.m.counts.inserts += 1
            self.m.counts.episodes["completed"] += 1
            if self.staleness(ep) > self.max_staleness:  # finished already too old to ever be served
                self._drop_ready([ep.episode_id], "stale")

    def _close(self, ep: Episode) -> None:
        self.in_progress.pop(ep.episode_id, None)
        actor = self.actors.get(ep.actor_key)
        if actor is not None:
            actor.running = max(0, actor.running - 1)
        self.closed[ep.episode_id] = None
        while len(self.closed) > MAX_CLOSED_IDS:
            self.closed.popitem(last=False)

    # ---- serving ---------------------------------------------------------------------------
    def set_learner_version(self, version: int) -> None:
        if version <= self.learner_version:
            return
        if self.journal is not None:
            self.journal.version(version)
        self.learner_version = version
        stale = [i for i, ep in self.ready.items() if self.staleness(ep) > self.max_staleness]
        if stale:  # staleness grows only when the version moves, so this is the only scan needed
            self._drop_ready(stale, "stale")

    def staleness(self, ep: Episode) -> int:
        return self.learner_version - ep.behaviour_version

    def take_batch(self, learner_version: int, n: int, max_tokens: int = 0) -> tuple[list[Episode], int] | None:
        """A batch by the sampling policy (at most n episodes, at most max_tokens), or None if not yet."""
        self.set_learner_version(learner_version)
        batch = select(self.policy, self.ready, max_episodes=n, max_tokens=max_tokens, group_size=self.group_size)
        if batch is None or not self.limiter.can_sample(len(batch), len(self.ready)):
            return None
        ids = [ep.episode_id for ep in batch]
        if self.journal is not None:
            self.journal.consumed(ids)  # before it leaves: a crash after this never serves it again
        self._remove_ready(ids)
        for ep in batch:
            s = self.staleness(ep)
            assert s <= self.max_staleness, "stale episode escaped the filter"
            self.m.served_staleness.observe(s)
            self.max_served_staleness = max(self.max_served_staleness, s)
        self.m.max_staleness_served.set(self.max_served_staleness)
        self.m.counts.episodes["served"] += len(batch)
        self.m.samples.inc(len(batch))
        dropped, self.dropped_since_batch = self.dropped_since_batch, 0
        return batch, dropped

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
        self.accepted -= len(ids)  # frees admission room, as AReaL does for rejected rollouts
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

    # ---- housekeeping ----------------------------------------------------------------------
    def expire(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        abandoned = [i for i, ep in self.in_progress.items() if now - ep.last_seen > self.episode_timeout_s]
        if abandoned:
            self.drop(abandoned, "abandoned")
        # could never be served: free its slot now
        hopeless = [i for i, ep in self.in_progress.items() if ep.turns and self.staleness(ep) > self.max_staleness]
        if hopeless:
            self.drop(hopeless, "stale")
        if self.policy == "group":
            orphans = self._incomplete_groups_older_than(now - self.group_timeout_s)
            if orphans:
                self.drop(orphans, "group_timeout")
        for key, actor in list(self.actors.items()):
            if now - actor.last_seen > self.actor_timeout_s and actor.outstanding:
                self.m.credits_reclaimed.inc(actor.outstanding)
                actor.outstanding = 0
            if now - actor.last_seen > self.actor_timeout_s and actor.running == 0:
                del self.actors[key]

    def _incomplete_groups_older_than(self, cutoff: float) -> list[str]:
        """Ready episodes of a group that stayed short of group_size since before `cutoff` (a sibling was
        abandoned or dropped): group sampling would hold them until they go stale, blocking admission room."""
        by_prompt: dict[str, list[Episode]] = {}
        for ep in self.ready.values():
            by_prompt.setdefault(ep.prompt_key, []).append(ep)
        orphans = []
        for members in by_prompt.values():
            # groups form in completion order, so the incomplete one is the tail
            tail = members[len(members) - len(members) % self.group_size:]
            if tail and tail[0].last_seen < cutoff:
                orphans.extend(ep.episode_id for ep in tail)
        return orphans

    def connected_actors(self, now: float | None = None) -> int:
        now = time.monotonic() if now is None else now
        return sum(1 for a in self.actors.values() if now - a.last_seen <= self.actor_timeout_s)

    def _bind_gauges(self) -> None:
        """The state gauges read the store when scraped, instead of being set after every change (setting
        seven gauges cost about 20 µs per drained group of messages, on the path every message takes).
        Scrapes run on the buffer's event loop (protocol/http_metrics.py), the thread that changes the store."""
        m = self.m
        m.ready_episodes.set_function(lambda: len(self.ready))
        m.running_episodes.set_function(lambda: self.running)
        m.items.labels("ready").set_function(lambda: len(self.ready))
        m.items.labels("running").set_function(lambda: self.running)
        m.learner_version.set_function(lambda: self.learner_version)
        m.actors.set_function(lambda: len(self.actors))
        m.connected_actors.set_function(self.connected_actors)
