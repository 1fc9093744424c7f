"""What the replay store tells the rest of the buffer: a small vocabulary of typed events, and the one seam
(StoreListener) through which the write-ahead journal, the metrics and the audit trail hear them.

The store keeps the domain (ingest, assembly, serving). The events a restart must replay (ChunksArrived,
BatchServed, TurnsSkipped, EpisodesDropped, VersionAdvanced) are emitted *before* the change they name
takes effect, so the journal logs a change before anyone can observe it; listeners hear an event in the
order they were attached, which puts the audit's line before the journal's record (buffer/audit.py says
why). Listeners only record: none changes the store, so it behaves the same with any set of them.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Protocol, Union

from turnstream.buffer.store.episodes import CriticReplay, Episode, Replay, Segment
from turnstream.protocol.messages import TurnChunk, TurnChunkBatch


@dataclass(slots=True)
class MessageRejected:
    """A message whose columns disagree: all of its `chunks` rejected, for one `reason`."""
    reason: str
    chunks: int


@dataclass(slots=True)
class ChunksArrived:
    """A message holding a chunk not seen before, before any of its chunks takes effect. `frames` are the
    wire frames it came in, None when it came otherwise (the journal encodes it then)."""
    message: TurnChunkBatch
    frames: list | None


@dataclass(slots=True)
class ChunkAccepted:
    chunk: TurnChunk


@dataclass(slots=True)
class ChunkDuplicate:
    """A chunk whose (actor_id, epoch, seq) was taken in before: acked again, applied once."""
    chunk: TurnChunk


@dataclass(slots=True)
class ChunkRejected:
    chunk: TurnChunk
    reason: str


@dataclass(slots=True)
class EpisodeStarted:
    episode_id: str
    used_credit: bool  # False: its actor started it without a credit the buffer granted


@dataclass(slots=True)
class EpisodeCompleted:
    """A complete episode enters the table (it may still be dropped as stale right after)."""
    episode: Episode


@dataclass(slots=True)
class EpisodesDropped:
    """Episodes closed for a counted reason (stale, abandoned, group_timeout, uniform_group), never served."""
    episode_ids: list[str]
    reason: str


@dataclass(slots=True)
class TurnsSkipped:
    """Turns [first, end) of an episode served in segments, past the staleness bound: passed over, as if
    served (its fresher turns still are)."""
    episode_id: str
    first: int
    end: int


@dataclass(slots=True)
class BatchServed:
    """A batch about to leave: its fresh items in order and the staleness of each, at `learner_version`, and
    the replays and critic-only episodes that follow them (not consumed, not fresh)."""
    items: list[Episode | Segment]
    staleness: list[int]
    learner_version: int
    max_served_staleness: int  # the largest staleness the store ever served, this batch included
    groups: int  # complete groups in it (buffer.sampling = group), else 0
    replays: list[Replay] = field(default_factory=list)
    kept_for_replay: list[str] = field(default_factory=list)  # ids of its episodes kept to be served again
    for_critic: list[CriticReplay] = field(default_factory=list)  # older episodes for the critic alone, last
    max_staleness: int = 0  # the policy's bound (buffer.max_staleness), which critic-only episodes may exceed

    @property
    def critic_staleness(self) -> list[int]:
        return [self.learner_version - r.behaviour_version for r in self.for_critic]

    def critic_turns(self) -> tuple[int, int]:
        """Turns of the critic-only episodes within the policy's bound and past it (what only the critic learns)."""
        beyond = sum(len(r.episode.turns) for r, s in zip(self.for_critic, self.critic_staleness)
                     if s > self.max_staleness)
        return sum(len(r.episode.turns) for r in self.for_critic) - beyond, beyond

    @property
    def episode_ids(self) -> list[str]:
        """The complete episodes among the items: they leave the store for good."""
        return [item.episode_id for item in self.items if isinstance(item, Episode)]

    @property
    def segments(self) -> list[Segment]:
        """The segments of open episodes among the items."""
        return [item for item in self.items if isinstance(item, Segment)]


@dataclass(slots=True)
class VersionAdvanced:
    version: int


@dataclass(slots=True)
class CreditsGranted:
    credits: int


@dataclass(slots=True)
class CreditsReclaimed:
    """Unused credits taken back from an actor silent for buffer.actor_timeout_s."""
    credits: int


StoreEvent = Union[MessageRejected, ChunksArrived, ChunkAccepted, ChunkDuplicate, ChunkRejected, EpisodeStarted,
                   EpisodeCompleted, EpisodesDropped, TurnsSkipped, BatchServed, VersionAdvanced, CreditsGranted,
                   CreditsReclaimed]


class StoreListener(Protocol):
    def on_event(self, event: StoreEvent) -> None:
        """Record `event`; events a listener has no use for it ignores."""


class Listeners:
    """The store's fan-out: every attached listener hears each event, in the order they were attached."""

    def __init__(self) -> None:
        self._listeners: list[StoreListener] = []

    def add(self, listener: StoreListener) -> None:
        self._listeners.append(listener)

    def emit(self, event: StoreEvent) -> None:
        for listener in self._listeners:
            listener.on_event(event)

    @contextmanager
    def muted(self) -> Iterator[None]:
        """No listener hears what happens inside (a log replay rebuilds state; it is not new traffic)."""
        attached, self._listeners = self._listeners, []
        try:
            yield
        finally:
            self._listeners = attached
