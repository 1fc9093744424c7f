"""Admission control: AReaL's capacity rule, and the credits that carry it to actors.

An actor starts an episode only with a credit. The buffer grants credits while all of these hold:
- running < max_running;
- accepted + running < (eta + v + 1) * B: at most eta batches of B beyond learner version v may be in
  flight or waiting, so nothing admitted now can be more than eta versions stale when it is trained on
  (served episodes count up to (v + 1) * B: more were lost in a crash window, not trained);
- running + ready < max_items: memory;
- the rate limiter has insert room (buffer/store/ratelimit.py).
`running` counts credits granted but not yet used and episodes in progress; `accepted` counts completed
episodes not since dropped (a dropped episode gives its room back, as AReaL does for rejected rollouts).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from turnstream.buffer.store.events import CreditsGranted, CreditsReclaimed, StoreEvent
from turnstream.buffer.store.ratelimit import RateLimiter

ActorKey = tuple[str, int]  # (actor_id, epoch)


@dataclass
class ActorState:
    identity: bytes
    slots: int = 0
    outstanding: int = 0  # credits granted but not yet used to start an episode
    running: int = 0  # started, not yet complete
    last_seen: float = field(default_factory=time.monotonic)


class Admission:
    def __init__(self, *, batch_episodes: int, eta: int, max_running: int, max_items: int, actor_timeout_s: float,
                 limiter: RateLimiter, emit: Callable[[StoreEvent], None]):
        self.batch_episodes, self.eta = batch_episodes, eta
        self.max_running, self.max_items, self.actor_timeout_s = max_running, max_items, actor_timeout_s
        self.limiter, self.emit = limiter, emit
        self.actors: dict[ActorKey, ActorState] = {}
        self._accepted = 0
        self._grant_turn = 0  # rotates where grant() starts sharing

    @property
    def accepted(self) -> int:
        """Completed episodes not since dropped (served ones included)."""
        return self._accepted

    def episode_accepted(self) -> None:
        """An episode completed: it holds its room until it is dropped."""
        self._accepted += 1

    def episodes_dropped(self, n: int) -> None:
        """`n` completed episodes were dropped: their room is free again."""
        self._accepted -= n

    def restore_accepted(self, accepted: int) -> None:
        """The count a compacted write-ahead log kept."""
        self._accepted = accepted

    def unused_credits(self) -> int:
        return sum(a.outstanding for a in self.actors.values())

    def capacity(self, *, in_progress: int, ready: int, learner_version: int) -> int:
        """How many more episodes may start now (the rule above)."""
        running = self.unused_credits() + in_progress
        # Served episodes count up to the batch the learner may hold beyond its version: a batch lost in a crash
        # window (served, never trained) would otherwise hold its room for good, and a few such losses would
        # close admission. With eta = 0 that one batch is all the room there is.
        served = min(self._accepted - ready, (learner_version + 1) * self.batch_episodes)
        staleness_room = (self.eta + learner_version + 1) * self.batch_episodes - (served + ready + running)
        memory_room = self.max_items - (running + ready)
        return max(0, min(self.max_running - running, staleness_room, memory_room,
                          self.limiter.insert_room(running)))

    def on_credit_request(self, identity: bytes, actor_id: str, epoch: int, slots: int) -> None:
        self.heard_from((actor_id, epoch), identity).slots = max(0, slots)

    def heard_from(self, key: ActorKey, identity: bytes) -> ActorState:
        """The actor's state, created on first contact; its routing identity and last-seen time updated."""
        state = self.actors.get(key)
        if state is None:
            state = self.actors[key] = ActorState(identity=identity)
        elif identity:  # a chunk replayed from the log has none
            state.identity = identity
        state.last_seen = time.monotonic()
        return state

    def wanted(self) -> int:
        return sum(max(0, a.slots - a.outstanding - a.running) for a in self.actors.values())

    def grant(self, room: int) -> list[tuple[bytes, int]]:
        """Share `room` one credit at a time round the actors that want some, starting after the actor that got
        the last credit last time: first-come order would let fast actors starve a late one."""
        wanting = [a for a in self.actors.values() if a.slots - a.outstanding - a.running > 0]
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
        self.emit(CreditsGranted(sum(n for _, n in grants)))
        return grants

    def start_episode(self, actor: ActorState) -> bool:
        """An episode of `actor` arrived with its first chunk; returns whether it used a credit."""
        actor.running += 1
        if actor.outstanding > 0:
            actor.outstanding -= 1
            return True
        return False

    def end_episode(self, key: ActorKey) -> None:
        actor = self.actors.get(key)
        if actor is not None:
            actor.running = max(0, actor.running - 1)

    def forget_silent(self, now: float) -> None:
        """Actors silent for actor_timeout_s lose their unused credits, and are forgotten once they have no
        episode running."""
        for key, actor in list(self.actors.items()):
            if now - actor.last_seen <= self.actor_timeout_s:
                continue
            if actor.outstanding:
                self.emit(CreditsReclaimed(actor.outstanding))
                actor.outstanding = 0
            if actor.running == 0:
                del self.actors[key]

    def connected(self, now: float | None = None) -> int:
        now = time.monotonic() if now is None else now
        return sum(1 for a in self.actors.values() if now - a.last_seen <= self.actor_timeout_s)
