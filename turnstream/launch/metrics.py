"""The launcher's own /metrics and /healthz: which role processes run, how often each was started, uptime.

The launcher's main thread is a plain polling loop (it must stay signal-safe and simple), so the aiohttp
server of `protocol.http_metrics` runs on an event loop in a daemon thread. Gauges are read at scrape time
from the process table, so a scrape never sees a stale "up" for a process that already died.
"""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

from turnstream.core.build_info import register_build_info
from turnstream.launch.processes import ProcessGroup

# Process names are "<role>" or "<role>-<index>"; the role is the bounded label, the index is not exported
# (Prometheus series per actor index would grow with the fleet, and `sum by (role)` is what alerts need).
ROLES = ("vllm", "buffer", "learner", "actor")


def role_of(process_name: str) -> str:
    return process_name.split("-", 1)[0]


class LauncherMetrics:
    def __init__(self, procs: ProcessGroup, registry: CollectorRegistry | None = None):
        r = self.registry = registry or CollectorRegistry()
        self.procs = procs
        started = time.monotonic()
        register_build_info(r, "launcher")
        self.running = Gauge("turnstream_launcher_processes_running",
                             "Role processes started by the launcher that are still running", ["role"], registry=r)
        self.expected = Gauge("turnstream_launcher_processes_expected",
                              "Role processes the launcher started (the target count)", ["role"], registry=r)
        self.starts = Counter("turnstream_launcher_process_starts_total",
                              "Role process starts; starts above the expected count are restarts", ["role"],
                              registry=r)
        self.restarts = Counter("turnstream_launcher_restarts_total",
                                "Role processes started again after they failed (launch.restart = on-failure)",
                                ["role"], registry=r)
        self.uptime = Gauge("turnstream_launcher_uptime_seconds", "Seconds since the launcher started",
                            registry=r)
        self.uptime.set_function(lambda: time.monotonic() - started)
        for role in ROLES:
            self.running.labels(role).set_function(lambda role=role: self._count(role, running_only=True))
            self.expected.labels(role).set_function(lambda role=role: self._count(role, running_only=False))
            self.starts.labels(role)  # export 0 before the first start, so rate() has a baseline
            self.restarts.labels(role)

    def started(self, process_name: str) -> None:
        self.starts.labels(role_of(process_name)).inc()

    def restarted(self, process_name: str) -> None:
        self.started(process_name)
        self.restarts.labels(role_of(process_name)).inc()

    def _count(self, role: str, running_only: bool) -> int:
        latest = {c.name: c for c in self.procs.children}  # a restarted name counts once
        return sum(1 for c in latest.values()
                   if role_of(c.name) == role and (not running_only or c.proc.poll() is None))

    def health(self) -> dict:
        return {"processes": {c.name: "running" if c.proc.poll() is None else f"exited {c.proc.returncode}"
                              for c in self.procs.children},
                "incarnations": {c.name: getattr(c, "incarnation", 1) for c in self.procs.children}}


class MetricsThread:
    """Runs `start_metrics_server` on its own event loop in a daemon thread; start() returns the bound port."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int, health: Callable[[], dict] | None = None):
        self.registry, self.host, self.port, self.health = registry, host, port, health
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self, timeout_s: float = 10.0) -> int:
        bound: Future[int] = Future()
        self._thread = threading.Thread(target=self._run, args=(bound,), name="launcher-metrics", daemon=True)
        self._thread.start()
        self.port = bound.result(timeout_s)  # re-raises a bind error (e.g. port in use) in the caller
        return self.port

    def _run(self, bound: Future) -> None:
        from turnstream.protocol.http_metrics import start_metrics_server

        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            runner, port = loop.run_until_complete(
                start_metrics_server(self.registry, self.host, self.port, health=self.health))
        except BaseException as exc:  # noqa: BLE001 - handed to the starting thread
            bound.set_exception(exc)
            loop.close()
            return
        bound.set_result(port)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
