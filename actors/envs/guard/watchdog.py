"""The loop watchdog: notices an environment call that holds the actor's event loop past its time limit while it
still holds it.

A call on the loop (env.isolation = "loop", and an agent function) is cut off at its time limit only when it next
yields to the loop; code that blocks (a `time.sleep`, a hung socket read, an endless loop) never yields, and every
episode of the actor, its link to the buffer and its /metrics wait with it. The loop cannot see that, so a thread
does: `Timed` (timed.py) marks each stretch an environment call holds the loop, and the watchdog polls the mark.

A stretch past its call's time limit is a stall: the watchdog counts it
(`turnstream_actor_env_loop_stalls_total{env,call}`) and logs the environment and the call. A stall that ends
within `grace_s` more is cut off by the guard's time limit as soon as the loop is free (the episode is abandoned as
`timeout`) and the actor goes on. One that does not cannot be ended from outside the loop (nothing can unwind code
that does not return), so the recovery is the process's end: the actor exits with LOOP_STALL_EXIT_STATUS, the
launcher restarts it (launch.restart = on-failure) with a new epoch, and the buffer drops its episodes in flight
after buffer.episode_timeout_s. Its /metrics was served by the blocked loop, so a scrape sees the stall as the
actor's restart (`turnstream_launcher_restarts_total{role="actor"}`) and the log line says why.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
import weakref
from abc import ABC, abstractmethod
from dataclasses import dataclass

from turnstream.actors.metrics import ActorMetrics

log = logging.getLogger("turnstream.actor")

LOOP_STALL_EXIT_STATUS = 70  # EX_SOFTWARE: the launcher's log names it with the actor's last log line
STALL_GRACE_S = 10.0  # a stall still holding the loop this long past its limit ends the actor
POLL_S = 0.1


@dataclass
class Stretch:
    """An environment call holding the loop: `started` (time.perf_counter) is when its current stretch began,
    None between stretches."""

    env: str
    call: str
    limit_s: float
    metrics: ActorMetrics
    started: float | None = None
    stalled: bool = False  # its current stretch is past the limit (counted, logged)
    recovering: bool = False  # past the grace too: handed to the recovery


class StallRecovery(ABC):
    @abstractmethod
    def recover(self, stretch: Stretch, held_s: float) -> None:
        """A stall held the loop `held_s`, past its limit and the grace: end it (on the watchdog's thread)."""


class ExitProcess(StallRecovery):
    """The actor process exits non-zero, for its supervisor to restart it."""

    def recover(self, stretch: Stretch, held_s: float) -> None:
        log.error("the actor exits with status %d: environment %s has held its event loop for %.1fs in %s, past "
                  "its %gs limit, and code that does not return cannot be cut off; its episodes in flight are "
                  "abandoned (the buffer drops them after buffer.episode_timeout_s) and the launcher restarts it; "
                  "set env.isolation = \"process\" to run the environment in worker processes",
                  LOOP_STALL_EXIT_STATUS, stretch.env, held_s, stretch.call, stretch.limit_s)
        for handler in logging.getLogger().handlers + log.handlers:
            handler.flush()
        sys.stderr.flush()
        os._exit(LOOP_STALL_EXIT_STATUS)


class LoopWatchdog:
    """Watches the stretch `current` marks (one event loop's), from a daemon thread started with the first mark and
    ended when the watchdog is collected."""

    def __init__(self, grace_s: float = STALL_GRACE_S, recovery: StallRecovery | None = None, poll_s: float = POLL_S):
        self.grace_s, self.poll_s = grace_s, poll_s
        self.recovery = recovery or ExitProcess()
        self.current: Stretch | None = None
        self._thread: threading.Thread | None = None

    def enter(self, stretch: Stretch) -> None:
        """`stretch` holds the loop from now (called on the loop's thread, at the start of every stretch)."""
        stretch.started, stretch.stalled, stretch.recovering = time.perf_counter(), False, False
        self.current = stretch
        if self._thread is None:
            self._thread = threading.Thread(target=_watch, args=(weakref.ref(self), self.poll_s),
                                            name="env-loop-watchdog", daemon=True)
            self._thread.start()

    def leave(self) -> None:
        self.current = None

    def check(self) -> None:
        """One look at the stretch in progress (the thread's poll)."""
        stretch = self.current
        started = None if stretch is None else stretch.started
        if stretch is None or started is None:
            return
        held = time.perf_counter() - started
        if held <= stretch.limit_s:
            return
        if not stretch.stalled:
            stretch.stalled = True
            stretch.metrics.env_loop_stalls.labels(stretch.env, stretch.call).inc()
            log.error("environment %s has held the actor's event loop for %.1fs in %s, past its %gs limit, and "
                      "still holds it: every episode of this actor waits; the actor exits if it still holds it "
                      "%gs from now", stretch.env, held, stretch.call, stretch.limit_s, self.grace_s)
        if held > stretch.limit_s + self.grace_s and not stretch.recovering and self.current is stretch \
                and stretch.started == started:
            stretch.recovering = True
            self.recovery.recover(stretch, held)


def _watch(watchdog: "weakref.ref[LoopWatchdog]", poll_s: float) -> None:
    while True:
        time.sleep(poll_s)
        dog = watchdog()
        if dog is None:
            return
        dog.check()
        del dog  # held only while it looks: the watchdog's owner decides its life
