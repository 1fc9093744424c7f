"""What the learner's loop tells its helpers: a small vocabulary of typed events, and the one seam (LearnerListener)
through which the step record, the audit trail, the checkpoint cadence, the step's log line, the metrics and the
experiment trackers hear them (learner/listeners.py picks them once, at start-up).

A step goes StepTrained, then VersionSaved, then VersionPublished; LearnerStopped ends the run. Listeners hear an
event in the order they were attached and are awaited one after the other, so a listener's work on an event is
done before the loop goes on: the record of a step is durable, and its periodic checkpoint written, before its
version is pushed or announced (learner/record/format.py). A listener may hand back figures of its own (seconds,
bytes) for the step's stats line; none changes the trainer, so the learner trains the same with any set of them.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, Union

from turnstream.protocol.messages import Batch


@dataclass(frozen=True, slots=True)
class StepTrained:
    """The trainer produced `version` from `batch`, before the version's weights are saved. `stats` are the step's
    own (learner/step/trainer.py); `generator_before` the state of the trainer's generator before the step drew
    (what a replay restores)."""
    version: int
    batch: Batch
    stats: Mapping[str, Any]
    generator_before: bytes


@dataclass(frozen=True, slots=True)
class VersionSaved:
    """`version`'s weights are saved for its push, which has not started: it is neither pushed nor announced."""
    version: int


@dataclass(frozen=True, slots=True)
class VersionPublished:
    """`version` was pushed into the servers (or its push failed: push_s is NaN) and announced; `stats` is the
    step's complete line, the figures of every listener and of the push included."""
    version: int
    stats: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class LearnerStopped:
    """The loop ended at `version`, its last push drained; nothing is heard after it."""
    version: int


LearnerEvent = Union[StepTrained, VersionSaved, VersionPublished, LearnerStopped]


class LearnerListener(Protocol):
    async def on_event(self, event: LearnerEvent) -> dict[str, float]:
        """Act on `event` (events a listener has no use for it ignores); return the figures it adds to the step's
        stats line, if any."""


class Listeners:
    """The loop's fan-out: every attached listener hears each event, in the order they were attached."""

    def __init__(self, listeners: list[LearnerListener] | None = None) -> None:
        self._listeners: list[LearnerListener] = list(listeners or [])

    def add(self, listener: LearnerListener) -> None:
        self._listeners.append(listener)

    async def emit(self, event: LearnerEvent) -> dict[str, float]:
        """Each listener in turn; the figures they return, in their order."""
        figures: dict[str, float] = {}
        for listener in self._listeners:
            figures.update(await listener.on_event(event))
        return figures
