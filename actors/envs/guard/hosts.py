"""Where a run's environments are made: on the actor's event loop, or in worker processes (env.isolation)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable

from turnstream.actors.environment import Environment
from turnstream.actors.envs.guard.pool import WorkerPool
from turnstream.actors.envs.guard.remote import WorkerEnvironment
from turnstream.actors.envs.guard.settings import GuardSettings
from turnstream.actors.loop_shared import LoopShared
from turnstream.actors.metrics import ActorMetrics


class EnvHost(ABC):
    runs_on_loop: bool  # whether the environments' code runs on the actor's event loop (and may block it)

    @abstractmethod
    async def open(self, metrics: ActorMetrics) -> Environment:
        """A new environment for one episode."""


class LoopHost(EnvHost):
    """Environments made by `make_env` in the actor's process, run on its event loop."""

    runs_on_loop = True

    def __init__(self, make_env: Callable[[], Environment]):
        self.make_env = make_env

    async def open(self, metrics: ActorMetrics) -> Environment:
        return self.make_env()


# one pool per host and event loop, stopped when the loop ends (the actor's stop, graceful or not)
_POOLS: LoopShared[WorkerPool] = LoopShared("environment workers", alive=lambda pool: not pool.closed,
                                            close=lambda pool: pool.close())


class WorkerHost(EnvHost):
    """Environments made from their registry name in the actor's worker processes (pool.py), started with the
    first episode."""

    runs_on_loop = False

    def __init__(self, name: str, args: dict, settings: GuardSettings):
        self.name, self.args, self.settings = name, dict(args), settings

    async def open(self, metrics: ActorMetrics) -> Environment:
        pool = await _POOLS.get(lambda: WorkerPool.start(self.settings, metrics), key=self)
        return await WorkerEnvironment.open(pool, self.name, self.args)


def host_for(name: str, args: dict, make_env: Callable[[], Environment], settings: GuardSettings) -> EnvHost:
    return WorkerHost(name, args, settings) if settings.isolation == "process" else LoopHost(make_env)
