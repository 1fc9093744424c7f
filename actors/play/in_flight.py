"""How many episodes an actor plays at once: K that want generation, and more while some wait on their
environment.

`actor.concurrent_episodes` (K) bounds the episodes that want generation. An episode inside an environment call
(a tool of long latency, a slow reset) wants none meanwhile, so once the call has lasted WAIT_GRACE_S another
may start in its place, up to `actor.max_episodes_in_flight` in all: that cap bounds memory, environment
instances and credits. Without this, K episodes waiting on slow tools would leave the inference servers idle.
With environments that answer at once nothing changes: about K episodes are in flight.

The environment loop marks its calls with `PlayContext.waiting_on_env()`. The mark finds the gate of the episode
in the task the episode runs in (a context variable the runner sets), so an episode the runner did not start (an
evaluation round's, a test's) is not counted and cannot open room for others.

Every episode still starts with a buffer credit. The actor asks the buffer for credits for the episodes it has
in flight plus the K it could start now (`slots`), so the buffer's admission control (the staleness bound,
max_running, memory) bounds these episodes as it bounds any, and an actor holds at most K unused credits, as
with a fixed K. An episode abandoned after it streamed is still running for the buffer until its episode timeout
(it hears nothing of the failure), so the actor asks for a credit more for each such episode meanwhile.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from contextvars import ContextVar
from typing import AsyncIterator

from prometheus_client import Gauge

from turnstream.actors.envs.waiting import carrying

# An environment call counts as waiting only once it has lasted this long. Replies of one inference batch come
# back together and their episodes step together: were an instant step counted, each such wave would let K more
# episodes start, and episodes would pile up to the cap with environments that never make anyone wait.
WAIT_GRACE_S = 0.05

_episode_gate: ContextVar[EpisodeGate | None] = ContextVar("turnstream_episode_gate", default=None)


class EpisodeGate:
    """Admits a new episode while fewer than `want_generation` of those in flight want generation and fewer than
    `cap` are in flight; `waiting_gauge` follows the episodes waiting on their environment."""

    def __init__(self, want_generation: int, cap: int, waiting_gauge: Gauge | None = None, *,
                 buffer_expiry_s: float = 60.0, grace_s: float = WAIT_GRACE_S):
        """`buffer_expiry_s`: how long the buffer keeps counting an abandoned episode as running
        (buffer.episode_timeout_s)."""
        if not 1 <= want_generation <= cap:
            raise ValueError(f"need 1 <= want_generation ({want_generation}) <= cap ({cap})")
        self.want_generation, self.cap, self.grace_s = want_generation, cap, grace_s
        self.waiting_gauge, self.buffer_expiry_s = waiting_gauge, buffer_expiry_s
        self.in_flight = 0
        self.waiting_on_env = 0
        self._changed = asyncio.Event()
        self._held_until: deque[float] = deque()  # when the buffer lets go of each abandoned episode

    @property
    def generating(self) -> int:
        """Episodes in flight that are not inside an environment call."""
        return self.in_flight - self.waiting_on_env

    def has_room(self) -> bool:
        return self.in_flight < self.cap and self.generating < self.want_generation

    def slots(self) -> int:
        """The episodes worth holding credits for: those in flight, the K that could start now, and those
        abandoned that the buffer still counts as running."""
        now = time.monotonic()
        while self._held_until and self._held_until[0] <= now:
            self._held_until.popleft()
        return min(self.cap, self.in_flight + self.want_generation) + len(self._held_until)

    def abandoned_midway(self) -> None:
        """An episode that had streamed turns was abandoned. The buffer hears nothing of it and counts it
        running, against this actor's credits, until its episode timeout drops it: asking for no more credits
        meanwhile would starve the actor after a burst of failures (a crashed environment worker)."""
        self._held_until.append(time.monotonic() + self.buffer_expiry_s)

    async def enter(self) -> None:
        """Wait for room, then count one more episode in flight."""
        while not self.has_room():
            self._changed.clear()
            await self._changed.wait()
        self.in_flight += 1

    def leave(self) -> None:
        self.in_flight -= 1
        self._changed.set()

    def adopt_current_task(self) -> None:
        """Count the environment calls of the task calling this (an episode's own task) at this gate."""
        _episode_gate.set(self)

    @contextlib.asynccontextmanager
    async def waiting(self) -> AsyncIterator[None]:
        """Count the episode as waiting on its environment once the call has lasted `grace_s` (not while the
        environment's host says it is waiting for room: actors/envs/waiting.py)."""
        mark = _WaitMark(self)
        try:
            with carrying(mark):
                yield
        finally:
            mark.pause()

    def _waiting(self, delta: int) -> None:
        self.waiting_on_env += delta
        if self.waiting_gauge is not None:
            self.waiting_gauge.inc(delta)


class _WaitMark:
    """One environment call of an episode at a gate: counted as waiting from `grace_s` after it starts (or
    resumes) until it ends (or pauses)."""

    def __init__(self, gate: EpisodeGate):
        self.gate, self.counted, self.timer = gate, False, None
        self.resume()

    def resume(self) -> None:
        self.timer = asyncio.get_running_loop().call_later(self.gate.grace_s, self._count)

    def pause(self) -> None:
        self.timer.cancel()
        if self.counted:
            self.counted = False
            self.gate._waiting(-1)

    def _count(self) -> None:
        self.counted = True
        self.gate._waiting(+1)
        self.gate._changed.set()  # one fewer wants generation: room for another


@contextlib.asynccontextmanager
async def waiting_on_env() -> AsyncIterator[None]:
    """Mark the calling episode as waiting on its environment, if a runner's gate counts it."""
    gate = _episode_gate.get()
    if gate is None:
        yield
        return
    async with gate.waiting():
        yield
