"""The wrapper every episode's environment is played through: time limits on its calls, and the stretches it
holds the actor's event loop measured (timed.py).

Which limit applies: the environment's own (`reset_timeout_s`, `step_timeout_s`, `close_timeout_s`, class or
instance attributes), since it knows its tool, else the run's (env.*_timeout_s). Making the environment (in a
worker: creating it there) counts under the run's reset limit, its own limits being unknown until it exists. A
reset or step past its limit raises `EnvError` of kind `timeout`, which abandons the episode; a close that fails
or runs out of time is logged and counted (turnstream_actor_env_close_failures_total) and never fails the slot.
A call is cancelled at its limit: an environment on the loop whose code blocks is cut off only when it next
yields to the loop (one that returns past its limit without yielding is a timeout all the same), and one that
holds the loop past its limit is noticed meanwhile by the loop watchdog (watchdog.py); in a worker, one that does
not stop gets its worker retired (pool.py).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, TypeVar

from turnstream.actors.environment import EnvError, Environment, Reset, Step
from turnstream.actors.envs.guard.hosts import EnvHost
from turnstream.actors.envs.guard.settings import GuardSettings
from turnstream.actors.envs.guard.timed import LoopBlockMeter
from turnstream.actors.metrics import ActorMetrics

T = TypeVar("T")
log = logging.getLogger("turnstream.actor")


class GuardedEnvironment(Environment):
    """One episode's environment from `host`, made at the first reset."""

    def __init__(self, host: EnvHost, settings: GuardSettings, meter: LoopBlockMeter, metrics: ActorMetrics):
        self.host, self.settings, self.meter, self.metrics = host, settings, meter, metrics
        self.env: Environment | None = None
        self.name = settings.name or "environment"

    # what the environment loop reads, after reset
    @property
    def action_tokens(self) -> list[str] | None:  # type: ignore[override]
        return self._env().action_tokens

    @property
    def max_action_tokens(self) -> int:  # type: ignore[override]
        return self._env().max_action_tokens

    @property
    def num_agents(self) -> int:  # type: ignore[override]
        return self._env().num_agents

    @property
    def num_tasks(self) -> int | None:  # type: ignore[override]
        return self._env().num_tasks

    def _env(self) -> Environment:
        if self.env is None:
            raise EnvError(f"{self.name}: read before reset", "protocol")
        return self.env

    async def reset(self, seed: int, task: int | None = None) -> Reset:
        if self.env is None:
            self.env = await self._call(self.host.open(self.metrics), "open", self.settings.reset_timeout_s)
            self.name = self.settings.name or type(self.env).__name__
        env = self.env
        # an environment that does not enumerate its tasks is never given one (its reset may not take it)
        reset = env.reset(seed) if task is None else env.reset(seed, task=task)
        return await self._call(reset, "reset", self.settings.reset_limit(env))

    async def step(self, action: str) -> Step:
        env = self._env()
        return await self._call(env.step(action), "step", self.settings.step_limit(env))

    async def close(self) -> None:
        if self.env is None:
            return
        try:
            await self._call(self.env.close(), "close", self.settings.close_limit(self.env))
        except Exception as exc:  # closing a dead remote environment must not fail the slot
            kind = exc.kind if isinstance(exc, EnvError) else "exception"
            self.metrics.env_close_failures.labels(kind).inc()
            log.warning("environment %s: close failed (%s): %r", self.name, kind, exc)

    async def _call(self, call: Awaitable[T], what: str, limit_s: float) -> T:
        if self.host.runs_on_loop:  # in a worker, what blocks is the worker's business (and it is isolated)
            call = self.meter.timed(call, self.name, what, limit_s, self.metrics)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        try:
            async with asyncio.timeout_at(deadline) as scope:
                result = await call
        except TimeoutError:
            if not scope.expired():  # the environment's own TimeoutError: a failure like any other
                raise
            raise EnvError(f"{self.name}: {what} did not return within {limit_s:g}s", "timeout") from None
        if loop.time() > deadline:  # it blocked the loop past its limit, so the limit never got to cancel it
            raise EnvError(f"{self.name}: {what} held the actor's event loop past its {limit_s:g}s limit", "timeout")
        return result
