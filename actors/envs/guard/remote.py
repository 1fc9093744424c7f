"""An environment in a worker process (pool.py), as the actor sees it: every call is a request to the worker."""
from __future__ import annotations

from turnstream.actors.environment import Environment, Reset, Step
from turnstream.actors.envs.guard.pool import Worker, WorkerPool
from turnstream.actors.envs.guard.wire import EnvAttributes


class WorkerEnvironment(Environment):
    """Its attributes (action tokens, agents, tasks, own time limits) are the worker's environment's, as they
    were when it was created and again after each reset."""

    def __init__(self, pool: WorkerPool, worker: Worker, ep: int, attrs: dict):
        self.pool, self.worker, self.ep = pool, worker, ep
        EnvAttributes.apply(attrs, self)

    @classmethod
    async def open(cls, pool: WorkerPool, name: str, args: dict) -> WorkerEnvironment:
        return cls(pool, *await pool.open(name, args))

    async def reset(self, seed: int, task: int | None = None) -> Reset:
        reply = await self.pool.call(self.worker, self.ep, "reset", seed=seed, task=task)
        EnvAttributes.apply(reply["attrs"], self)
        return Reset(**reply["reset"])

    async def step(self, action: str) -> Step:
        return Step(**await self.pool.call(self.worker, self.ep, "step", action=action))

    async def close(self) -> None:
        await self.pool.close_episode(self.worker, self.ep)
