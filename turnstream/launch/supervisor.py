"""The launcher's restart policy: which failed role process is started again, when, and when to give up.

A process fails when it exits with a non-zero status or is killed. Under `on-failure` it is started again
after a back-off that doubles with each restart the sliding window (`launch.restart_window_s`) already holds;
a process that fails once more after `launch.max_restarts` restarts in the window stops the run, as does any
failure under `never`, and any exit of a role that should run until the end (status 0 included: an actor or
a buffer that returns has stopped serving). The learner's clean exit (max_steps reached) ends the run and is
the caller's to handle.

The supervisor never blocks: `tick()` is called from the launcher's polling loop, restarts that are due run
there, and a restarted vLLM server is watched on later ticks until it answers (the launcher's hooks say
what a role needs before it may serve again).
"""
from __future__ import annotations

import logging
import os
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol

from turnstream.core.config_launch import LaunchSection
from turnstream.launch.metrics import LauncherMetrics, role_of
from turnstream.launch.processes import Child, ProcessGroup, tail

log = logging.getLogger("turnstream.launcher")


class RoleFailed(RuntimeError):
    """A role process failed and is not (or no longer) restarted; `str()` is one line, `log_tail` its log."""

    def __init__(self, summary: str, log_tail: str = ""):
        super().__init__(summary)
        self.log_tail = log_tail


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def role_failed(child: Child, why: str = "") -> RoleFailed:
    summary = f"{child.name} {describe_exit(child.proc.returncode)}{why}; its log: {child.log_path}"
    return RoleFailed(summary, tail(child.log_path))


class RestartHooks(Protocol):
    def relaunch(self, child: Child) -> Child:
        """Start `child` again (same name); may change its command line (a vLLM server's new port)."""

    def ready(self, child: Child) -> bool | None:
        """After a relaunch: True once it may serve (the hook did what that takes), None while not yet,
        False when it will not come up (its start-up timed out)."""


@dataclass
class Restarts:
    """One process name's restart history."""
    times: deque = field(default_factory=deque)  # monotonic times of its restarts within the window
    due: float | None = None  # when its scheduled restart runs
    starting: bool = False  # relaunched, not ready yet


class Supervisor:
    def __init__(self, procs: ProcessGroup, launch: LaunchSection, metrics: LauncherMetrics, hooks: RestartHooks,
                 clock: Callable[[], float] = time.monotonic):
        self.procs, self.launch, self.metrics, self.hooks, self.clock = procs, launch, metrics, hooks, clock
        self.books: dict[str, Restarts] = {}

    def tick(self) -> None:
        """Restart what failed and may be restarted (once its back-off has passed); raise RoleFailed for a
        failure the policy does not restart."""
        now = self.clock()
        for child in list(self.procs.children):
            book = self.books.setdefault(child.name, Restarts())
            while book.times and now - book.times[0] > self.launch.restart_window_s:
                book.times.popleft()
            if book.starting and child.proc.poll() is None:
                self._check_ready(child, book)
            elif child.proc.poll() is not None and book.due is None and not _finished_learner(child):
                self._schedule(child, book, now)
            if book.due is not None and now >= book.due:
                self._restart(child, book, now)

    def _schedule(self, child: Child, book: Restarts, now: float) -> None:
        book.starting = False
        role = role_of(child.name)
        if child.proc.returncode == 0:
            raise role_failed(child, " (a role that stops by itself ends the run)")
        if self.launch.policy(role) == "never":
            raise role_failed(child, " (launch restart policy for " + role + ": never)")
        if len(book.times) >= self.launch.max_restarts:
            raise role_failed(child, f" after {len(book.times)} restarts within {self.launch.restart_window_s:g} s "
                                     f"(launch.max_restarts = {self.launch.max_restarts})")
        delay = self.launch.backoff_s(len(book.times))
        book.due = now + delay
        log.warning("%s %s; restart %d in %.1f s (restart policy on-failure)", child.name,
                    describe_exit(child.proc.returncode), len(book.times) + 1, delay)

    def _restart(self, child: Child, book: Restarts, now: float) -> None:
        book.due = None
        book.times.append(now)
        new = self.hooks.relaunch(child)
        self.metrics.restarted(new.name)
        book.starting = True
        log.warning("%s restarted (pid %d, incarnation %d)", new.name, new.proc.pid, new.incarnation)
        self._check_ready(new, book)

    def _check_ready(self, child: Child, book: Restarts) -> None:
        ready = self.hooks.ready(child)
        if ready is None:
            return
        book.starting = False
        if not ready:  # it never came up: a failure like any other, counted against the window
            _kill(child)
            self._schedule(child, book, self.clock())

    def restarting(self) -> list[str]:
        """Names of processes waiting for their restart or not ready since."""
        return [name for name, book in self.books.items() if book.due is not None or book.starting]


def _finished_learner(child: Child) -> bool:
    return role_of(child.name) == "learner" and child.proc.returncode == 0  # max_steps reached: the caller's


def _kill(child: Child) -> None:
    try:
        os.killpg(child.proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    child.proc.wait()
