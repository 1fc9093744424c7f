"""Reverb-style samples-per-insert rate limiter, and the gate that blocked batch requests wait on.

An *insert* is an episode entering the table (admitted: it holds an actor credit until it completes),
a *sample* an episode leaving it (served, or dropped for a counted reason, so drops never wedge inserts).
With `diff = inserts * samples_per_insert - samples`:
- inserts block while one more would push `diff` above `max_diff`: actors get no credit and wait;
- samples of `n` block while the table is smaller than `min_size_to_sample` or `diff - n < min_diff`:
  the learner's request waits (up to its timeout).
Nothing is ever dropped to make room: the faster side waits. `min_diff`/`max_diff` come from Reverb's
(samples_per_insert, min_size_to_sample, error_buffer) form: `min_size * spi -/+ error_buffer`.
"""
from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

T = TypeVar("T")


class Cancelled(Exception):
    """The gate was cancelled (buffer shutting down): waiters give up instead of hanging."""


@dataclass
class RateLimiter:
    samples_per_insert: float = 1.0
    min_size_to_sample: int = 1
    error_buffer: float = math.inf
    inserts: int = 0
    samples: int = 0

    @property
    def min_diff(self) -> float:
        return self.min_size_to_sample * self.samples_per_insert - self.error_buffer

    @property
    def max_diff(self) -> float:
        return self.min_size_to_sample * self.samples_per_insert + self.error_buffer

    @property
    def diff(self) -> float:
        return self.inserts * self.samples_per_insert - self.samples

    def insert_room(self, pending: int = 0) -> int:
        """How many more episodes may be admitted, beyond `pending` admitted but not yet inserted."""
        if math.isinf(self.max_diff):
            return 1 << 30
        allowed = math.floor((self.max_diff + self.samples) / self.samples_per_insert + 1e-9)
        return max(0, allowed - self.inserts - pending)

    def can_sample(self, n: int, size: int) -> bool:
        return size >= max(self.min_size_to_sample, n) and self.diff - n >= self.min_diff - 1e-9

    def on_insert(self, n: int = 1) -> None:
        self.inserts += n

    def on_sample(self, n: int = 1) -> None:
        self.samples += n


def limiter_problem(spi: float, min_size_to_sample: int, error_buffer: float, *, batch_episodes: int,
                    max_items: int, eta: int) -> tuple[str, str]:
    """("", "") for a configuration that can always make progress, else (field, one-line reason)."""
    if not (spi > 0 and math.isfinite(spi)):
        return "samples_per_insert", "must be a positive number"
    if spi > 1:
        return "samples_per_insert", ("must be <= 1: each episode is served at most once, so a higher ratio "
                                      "would block the learner forever")
    if min_size_to_sample < 1:
        return "min_size_to_sample", "must be >= 1"
    if min_size_to_sample > max_items:
        return "min_size_to_sample", f"must be <= max_items ({max_items}), or sampling never starts (deadlock)"
    if min_size_to_sample > (eta + 1) * batch_episodes:
        return "min_size_to_sample", (f"must be <= (eta + 1) * batch_episodes ({(eta + 1) * batch_episodes}): "
                                      "admission stops there until the learner moves on (deadlock)")
    # Sampling a batch of B needs diff >= min_diff + B while inserts stop once diff would pass max_diff,
    # i.e. 2 * error_buffer >= B + spi (Reverb rejects windows narrower than 2 * max(1, spi) likewise).
    if not error_buffer >= 0:
        return "error_buffer", "must be >= 0"
    if 2 * error_buffer < batch_episodes + spi:
        return "error_buffer", (f"must be >= (batch_episodes + samples_per_insert) / 2 = "
                                f"{(batch_episodes + spi) / 2:g}, or a full batch can never be sampled (deadlock)")
    return "", ""


class Gate:
    """Waiters re-check their own condition whenever `notify` is called; `cancel` releases them all."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._cancelled = False

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    def cancel(self) -> None:
        self._cancelled = True
        self.notify()

    async def wait_for(self, attempt: Callable[[], T | None], timeout_s: float | None = None) -> T:
        """Return attempt()'s first non-None result; TimeoutError after timeout_s; Cancelled on cancel."""
        deadline = None if not timeout_s else time.monotonic() + timeout_s
        while True:
            if self._cancelled:
                raise Cancelled()
            got = attempt()
            if got is not None:
                return got
            event = self._event
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError()
            try:
                await asyncio.wait_for(event.wait(), left)
            except asyncio.TimeoutError:
                raise TimeoutError() from None


class BlockedClock:
    """Accumulates the seconds a condition held into a Prometheus counter, without a timer thread."""

    def __init__(self, counter) -> None:
        self.counter, self.since = counter, None

    def update(self, blocked: bool, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if self.since is not None:
            self.counter.inc(now - self.since)
        self.since = now if blocked else None
