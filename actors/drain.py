"""An actor's graceful stop: no new episode, the open ones finish and are acked, within a deadline.

`DrainableTasks` stands between the episode runner and its task source: once draining, it hands out no
assignment (the runner's slots return their credit and end, as when a finite order runs out), and it counts
the episodes handed out and not yet played in full. The runner reports an episode played only after the
buffer acked its last chunk, so "none open" means everything this actor streamed is acked.
"""
from __future__ import annotations

import asyncio
import logging
import time

from turnstream.actors.tasks.orders import Assignment
from turnstream.actors.tasks.source import TaskSource

log = logging.getLogger("turnstream.actor")


class DrainableTasks:
    def __init__(self, source: TaskSource):
        self.source = source
        self.draining = False
        self.open = 0  # episodes handed out whose chunks are not all acked yet

    def next(self) -> Assignment | None:
        if self.draining:
            return None
        assignment = self.source.next()
        if assignment is not None:
            self.open += 1
        return assignment

    def played(self, assignment: Assignment, prompt_keys) -> None:
        self.open -= 1
        self.source.played(assignment, prompt_keys)


async def drain(tasks: DrainableTasks, link, timeout_s: float, actor_id: str) -> int:
    """Stop new episodes and wait up to `timeout_s` for the open ones and every unacked chunk; returns the
    episodes abandoned at the deadline (the buffer drops their chunks as `abandoned` after its timeout)."""
    tasks.draining = True
    started = time.monotonic()
    log.info("%s: draining: no new episodes, %d open ones have %.0f s to finish", actor_id, tasks.open, timeout_s)
    while (tasks.open or link.unacked) and time.monotonic() - started < timeout_s:
        await asyncio.sleep(0.1)
    if tasks.open or link.unacked:
        log.warning("%s: drain timed out after %.0f s: %d episodes abandoned, %d chunks unacked", actor_id,
                    timeout_s, tasks.open, len(link.unacked))
    else:
        log.info("%s: drained in %.1f s: every chunk acked", actor_id, time.monotonic() - started)
    return tasks.open
