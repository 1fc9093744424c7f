"""The life of a role's process, shared by the actor, the buffer and the learner: SIGTERM/SIGINT set one stop
event, `/metrics` and `/healthz` are served for as long as the role runs, and the role's long-running tasks
are awaited until the first of them ends or a stop is asked for, then cancelled, with the first failure
raised again so that the process exits non-zero. A role whose work ends on its own once stopped (the learner's
loop finishes its step, pushes and checkpoints) hands it to `RoleProcess.run` beside its background tasks."""
from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass, field
from typing import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry

from turnstream.protocol.http_metrics import start_metrics_server

log = logging.getLogger("turnstream.role")


@dataclass
class RoleProcess:
    """`async with RoleProcess(registry, host, port) as role:` the metrics server is up (`role.metrics_port`
    is its bound port) and `role.stop` is set by SIGTERM or SIGINT; leaving the block stops the server."""
    registry: CollectorRegistry
    host: str
    port: int
    health: Callable[[], dict] | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    metrics_port: int = 0
    _http: web.AppRunner | None = None

    async def __aenter__(self) -> RoleProcess:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        self._http, self.metrics_port = await start_metrics_server(self.registry, self.host, self.port,
                                                                   health=self.health)
        return self

    async def __aexit__(self, *exc_info) -> None:
        if self._http is not None:
            await self._http.cleanup()

    async def until_stopped(self, tasks: list[asyncio.Task]) -> bool:
        """Wait until one of `tasks` ends or a stop is asked for; True when it was the stop (with every task
        still running), the case in which a role stops gracefully."""
        stopper = asyncio.create_task(self.stop.wait())
        await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        return self.stop.is_set() and not any(t.done() for t in tasks)

    async def run(self, work: asyncio.Task, background: list[asyncio.Task]) -> None:
        """Await `work`, which ends on its own once `stop` is set, beside the `background` tasks that serve it
        and never end by themselves. One that ends first (a failure) is logged and sets `stop`, so that `work`
        ends as on SIGTERM; then the background is cancelled and the first failure raised, `work`'s first."""
        if not await self.until_stopped([work, *background]) and not work.done():
            for task in background:
                if task.done():
                    failure = None if task.cancelled() else task.exception()
                    log.error("%s ended (%r): stopping", task.get_name(), failure)
            self.stop.set()
        await asyncio.wait([work])
        await finish([work, *background])


async def finish(tasks: list[asyncio.Task]) -> None:
    """Cancel what still runs, let it unwind, and raise the first failure of a task that ended on its own."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
