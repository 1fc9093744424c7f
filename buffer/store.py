"""Replay store: idempotent ingest, episode assembly, AReaL admission control and the staleness bound.

Pure logic without sockets, so every rule here is unit-testable. The server (buffer/server.py) feeds it
decoded messages and sends what it returns.

Invariants:
- a chunk is ingested at most once per (actor_id, epoch, seq);
- an episode reaches the learner only when complete and only if
  learner_version - min(token versions) <= max_staleness at the moment it is served;
- memory is bounded by max_items episodes: beyond it no credit is granted, so actors wait.
"""
from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np

from buffer.episodes import Episode
from buffer.metrics import BufferMetrics
from protocol.messages import TurnChunk

MAX_CLOSED_IDS = 200_000


@dataclass
class ActorState:
    identity: bytes
    slots: int = 0
    outstanding: int = 0  # credits granted but not yet used to start an episode
    running: int = 0  # started, not yet complete
    last_seen: float = field(default_factory=time.monotonic)


class SeqDeduper:
    """Per (actor, epoch): a watermark below which every seq was seen, plus the seen seqs above it."""

    def __init__(self) -> None:
        self._state: dict[tuple[str, int], tuple[int, set[int]]] = {}

    def seen(self, key: tuple[str, int], seq: int) -> bool:
        mark, above = self._state.get(key, (-1, set()))
        return seq <= mark or seq in above

    def add(self, key: tuple[str, int], seq: int) -> None:
        mark, above = self._state.get(key, (-1, set()))
        above.add(seq)
        while mark + 1 in above:
            mark += 1
            above.discard(mark)
        self._state[key] = (mark, above)


class ReplayStore:
    def __init__(self, *, batch_episodes: int, eta: int, max_staleness: int, max_running: int,
                 max_items: int, episode_timeout_s: float, actor_timeout_s: float, metrics: BufferMetrics):
        self.batch_episodes = batch_episodes
        self.eta = eta
        self.max_staleness = max_staleness
        self.max_running = max_running
        self.max_items = max_items
        self.episode_timeout_s = episode_timeout_s
        self.actor_timeout_s = actor_timeout_s
        self.m = metrics
        self.learner_version = 0
        self.max_served_staleness = 0
        self.accepted = 0  # completed episodes that were not later dropped
        self.in_progress: dict[str, Episode] = {}
        self.ready: deque[Episode] = deque()
        self.actors: dict[tuple[str, int], ActorState] = {}
        self.dedup = SeqDeduper()
        self.closed: OrderedDict[str, None] = OrderedDict()

    # ---- admission -------------------------------------------------------------------------
    @property
    def running(self) -> int:
        return sum(a.outstanding for a in self.actors.values()) + len(self.in_progress)

    def capacity(self) -> int:
        """AReaL: min(max_running - running, (eta + v + 1) * B - (accepted + running)), and memory."""
        staleness_room = (self.eta + self.learner_version + 1) * self.batch_episodes - (self.accepted + self.running)
        memory_room = self.max_items - (self.running + len(self.ready))
        return max(0, min(self.max_running - self.running, staleness_room, memory_room))

    def on_credit_request(self, identity: bytes, actor_id: str, epoch: int, slots: int) -> None:
        key = (actor_id, epoch)
        state = self.actors.setdefault(key, ActorState(identity=identity))
        state.identity, state.slots, state.last_seen = identity, max(0, slots), time.monotonic()

    def grant_credits(self) -> list[tuple[bytes, int]]:
        grants = []
        for state in self.actors.values():
            want = state.slots - state.outstanding - state.running
            n = min(want, self.capacity())
            if n > 0:
                state.outstanding += n
                grants.append((state.identity, n))
        if grants:
            self.m.credits_granted.inc(sum(n for _, n in grants))
        return grants

    # ---- ingest ----------------------------------------------------------------------------
    def ingest(self, identity: bytes, chunk: TurnChunk) -> tuple[str, str]:
        """Returns (status, reason): ("ok", ""), ("duplicate", "") or ("rejected", reason)."""
        key = (chunk.actor_id, chunk.epoch)
        if self.dedup.seen(key, chunk.seq):
            self.m.chunks.labels("duplicate").inc()
            return "duplicate", ""
        reason = validate_chunk(chunk)
        if not reason and chunk.episode_id in self.closed:
            reason = "episode_closed"
        ep = self.in_progress.get(chunk.episode_id)
        if not reason and ep is not None and (ep.actor_key != key or chunk.turn in ep.turns):
            reason = "episode_conflict"
        if not reason and ep is not None and _beyond_final_turn(ep, chunk):
            reason = "turn_after_done"
        if reason:
            self.dedup.add(key, chunk.seq)  # a resend of a bad chunk is still bad: do not count it twice
            self.m.chunks.labels("rejected").inc()
            self.m.rejected.labels(reason).inc()
            return "rejected", reason
        self.dedup.add(key, chunk.seq)
        actor = self.actors.setdefault(key, ActorState(identity=identity))
        actor.last_seen = time.monotonic()
        if ep is None:
            ep = Episode(chunk.episode_id, key, chunk.prompt_key)
            self.in_progress[chunk.episode_id] = ep
            if actor.outstanding > 0:
                actor.outstanding -= 1
            else:
                self.m.episodes.labels("started_without_credit").inc()
            actor.running += 1
            self.m.episodes.labels("started").inc()
        ep.add(chunk)
        self.m.chunks.labels("ok").inc()
        self.m.tokens_ingested.inc(chunk.obs_tokens.size + chunk.gen_tokens.size)
        if ep.complete:
            self._close(ep)
            self.ready.append(ep)
            self.accepted += 1
            self.m.episodes.labels("completed").inc()
        return "ok", ""

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
        self.learner_version = max(self.learner_version, version)

    def staleness(self, ep: Episode) -> int:
        return self.learner_version - ep.min_version

    def take_batch(self, learner_version: int, n: int) -> tuple[list[Episode], int] | None:
        """FIFO batch of n complete, fresh-enough episodes, or None if not yet available."""
        self.set_learner_version(learner_version)
        dropped = self._drop_stale_ready()
        if len(self.ready) < n:
            return None
        batch = [self.ready.popleft() for _ in range(n)]
        for ep in batch:
            s = self.staleness(ep)
            assert s <= self.max_staleness, "stale episode escaped the filter"
            self.m.served_staleness.observe(s)
            self.max_served_staleness = max(self.max_served_staleness, s)
            self.m.max_staleness_served.set(self.max_served_staleness)
        self.m.episodes.labels("served").inc(n)
        return batch, dropped

    def _drop_stale_ready(self) -> int:
        kept, dropped = deque(), 0
        for ep in self.ready:
            if self.staleness(ep) > self.max_staleness:
                dropped += 1
            else:
                kept.append(ep)
        if dropped:
            self.ready = kept
            self.accepted -= dropped  # frees admission room, as AReaL does for rejected rollouts
            self.m.dropped.labels("stale").inc(dropped)
        return dropped

    # ---- housekeeping ----------------------------------------------------------------------
    def expire(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for ep in list(self.in_progress.values()):
            if now - ep.last_seen > self.episode_timeout_s:
                self._close(ep)
                self.m.dropped.labels("abandoned").inc()
            elif ep.turns and self.staleness(ep) > self.max_staleness:
                self._close(ep)  # could never be served; free its slot now
                self.m.dropped.labels("stale").inc()
        for key, actor in list(self.actors.items()):
            if now - actor.last_seen > self.actor_timeout_s and actor.outstanding:
                self.m.credits_reclaimed.inc(actor.outstanding)
                actor.outstanding = 0
            if now - actor.last_seen > self.actor_timeout_s and actor.running == 0:
                del self.actors[key]

    def update_gauges(self) -> None:
        self.m.ready_episodes.set(len(self.ready))
        self.m.running_episodes.set(self.running)
        self.m.learner_version.set(self.learner_version)
        self.m.actors.set(len(self.actors))


def _beyond_final_turn(ep: Episode, c: TurnChunk) -> bool:
    """A turn after the one marked done, or a done marker before turns already received."""
    if ep.last_turn is not None and c.turn > ep.last_turn:
        return True
    return c.done and any(t > c.turn for t in ep.turns)


def validate_chunk(c: TurnChunk) -> str:
    """Empty string if the chunk is well formed, else a short reason (a metric label)."""
    n = c.gen_tokens.size
    if c.gen_tokens.ndim != 1 or c.obs_tokens.ndim != 1 or c.allowed_tokens.ndim != 1:
        return "bad_shape"
    if c.gen_logprobs.shape != (n,) or c.gen_versions.shape != (n,):
        return "length_mismatch"
    if c.turn < 0 or c.seq < 0 or c.epoch < 0:
        return "negative_index"
    if c.turn == 0 and c.obs_tokens.size == 0:
        return "empty_prompt"
    if (c.gen_tokens < 0).any() or (c.obs_tokens < 0).any() or (c.allowed_tokens < 0).any():
        return "negative_token"
    if n and (not np.isfinite(c.gen_logprobs).all() or (c.gen_logprobs > 1e-4).any()):
        return "bad_logprob"
    if (c.gen_versions < 0).any():
        return "bad_version"
    if not math.isfinite(c.reward) or not (c.temperature > 0 and math.isfinite(c.temperature)):
        return "bad_scalar"
    if c.allowed_tokens.size and n and not np.isin(c.gen_tokens, c.allowed_tokens).all():
        return "token_not_allowed"
    return ""
