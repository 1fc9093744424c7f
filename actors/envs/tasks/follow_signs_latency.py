"""Follow the signs behind a slow tool: every step waits a seeded, heavy-tailed wall-clock latency.

The learnable signal is exactly follow_signs' (`junctions`, a sign per turn, reward 1 only if every sign was
followed): the optimal policy gets reward 1, a policy blind to the signs 2^-k. What it adds is the wait an
agent's tool call costs: before answering, every step awaits `latency_s` (0.2 s), and one step in ten
(`long_share`) `long_factor` (10) times that, 2 s: a two-point mixture, so the median is `latency_s` and the
share of long calls is exactly what it says. The draws come from a generator seeded by the episode's seed
alone (not by the actions), so two runs of a seed wait the same.

What it is for (`turnstream bench trl`): a synchronous loop plays a turn of every episode of its batch, then
waits for the slowest step of that turn; with a batch of a hundred episodes nearly every turn holds a long
call, so nearly every turn costs `long_factor * latency_s`. An asynchronous actor samples other episodes
while one waits.

The wait is `asyncio.sleep` (the actor's event loop goes on); `sleep` is an attribute so that a test can read
the latencies without waiting them out.
"""
from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

from turnstream.actors.environment import Reset, Step, register
from turnstream.actors.envs.tasks.follow_signs import FollowSigns


@register("follow_signs_latency")
class FollowSignsLatency(FollowSigns):
    name = "follow_signs_latency"

    def __init__(self, junctions: list[int] | None = None, latency_s: float = 0.2, long_share: float = 0.1,
                 long_factor: float = 10.0):
        if latency_s <= 0 or long_factor < 1:
            raise ValueError("latency_s must be > 0 and long_factor >= 1")
        if not 0 <= long_share <= 1:
            raise ValueError("long_share must be in [0, 1]")
        super().__init__(junctions)
        self.latency_s, self.long_share, self.long_factor = latency_s, long_share, long_factor
        self.latencies = random.Random(0)
        self.sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    async def reset(self, seed: int, task: int | None = None) -> Reset:
        # a stream of its own: the signs stay follow_signs' for the same seed
        self.latencies = random.Random(f"follow_signs_latency/{seed}")
        return await super().reset(seed, task)

    def latency(self) -> float:
        """The next step's wait in seconds."""
        long = self.latencies.random() < self.long_share
        return self.latency_s * (self.long_factor if long else 1.0)

    async def step(self, action: str) -> Step:
        await self.sleep(self.latency())
        return await super().step(action)
