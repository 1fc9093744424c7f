"""How long an environment's coroutine holds the actor's event loop at a stretch.

A coroutine runs synchronously from one `send()` (or `throw()`) to the next suspension: everything the actor
does waits meanwhile, every other episode included. `Timed` drives the environment's awaitable itself, timing
each of those stretches, and hands everything it yields (futures, bare yields) to the task unchanged, and
everything thrown in (cancellation) to the coroutine unchanged, so the coroutine behaves as if awaited
directly. The cost is two clock reads and one generator frame per suspension, and two attribute writes for the
watchdog (watchdog.py), which notices a stretch past its call's time limit while it still holds the loop.
"""
from __future__ import annotations

import logging
import time
from typing import Awaitable, Callable, Generator, TypeVar

from turnstream.actors.envs.guard.watchdog import LoopWatchdog, Stretch
from turnstream.actors.metrics import ActorMetrics

T = TypeVar("T")
log = logging.getLogger("turnstream.actor")

LOG_EVERY_S = 30.0  # a blocking environment blocks on every step: one line per env per this long is enough


class Timed(Awaitable[T]):
    """Awaits `awaitable`; `on_block(seconds)` is called for each synchronous stretch longer than `warn_s`, and
    `watch` (a watchdog and the call's stretch) is shown each stretch while it runs."""

    __slots__ = ("awaitable", "warn_s", "on_block", "watch")

    def __init__(self, awaitable: Awaitable[T], warn_s: float, on_block: Callable[[float], None],
                 watch: tuple[LoopWatchdog, Stretch] | None = None):
        self.awaitable, self.warn_s, self.on_block, self.watch = awaitable, warn_s, on_block, watch

    def __await__(self) -> Generator[object, object, T]:
        inner = self.awaitable.__await__()
        clock, warn_s = time.perf_counter, self.warn_s
        dog, stretch = self.watch or (None, None)
        value: object = None
        thrown: BaseException | None = None
        while True:
            started = clock()
            if dog is not None:
                dog.enter(stretch)  # type: ignore[arg-type]
            try:
                yielded = inner.send(value) if thrown is None else inner.throw(thrown)
            except StopIteration as stop:
                return stop.value  # type: ignore[return-value]
            finally:  # the stretch ends here whether it suspended, returned or raised
                if dog is not None:
                    dog.leave()
                if (held := clock() - started) > warn_s:
                    self.on_block(held)
            try:
                value, thrown = (yield yielded), None
            except BaseException as exc:  # cancellation (or anything thrown at the task): the coroutine's to handle
                value, thrown = None, exc


class LoopBlockMeter:
    """Counts the stretches over the warning threshold by environment name, and says so in the log, at most
    once per LOG_EVERY_S per name; its watchdog sees each stretch while it runs."""

    def __init__(self, warn_s: float, watchdog: LoopWatchdog | None = None):
        self.warn_s = warn_s
        self.watchdog = watchdog or LoopWatchdog()
        self._logged_at: dict[str, float] = {}

    def timed(self, awaitable: Awaitable[T], name: str, call: str, limit_s: float, metrics: ActorMetrics) -> Timed[T]:
        """`awaitable`, the call `call` of environment `name`, timed; `limit_s`: the call's time limit."""
        return Timed(awaitable, self.warn_s, lambda held: self.blocked(name, call, held, metrics),
                     (self.watchdog, Stretch(name, call, limit_s, metrics)))

    def blocked(self, name: str, call: str, held_s: float, metrics: ActorMetrics) -> None:
        metrics.env_loop_blocks.labels(name).inc()
        metrics.env_loop_blocked_seconds.labels(name).inc(held_s)
        now = time.monotonic()
        last = self._logged_at.get(name)
        if last is None or now - last >= LOG_EVERY_S:
            self._logged_at[name] = now
            log.warning("environment %s held the actor's event loop for %.3fs in %s (every episode of this actor "
                        "waited); set env.isolation = \"process\" to run it in worker processes", name, held_s, call)
