"""Tasks whose outcome is a coin of fixed odds, whatever the agent does: a probe for task orders and curricula.

Task i succeeds (reward 1) with probability `success_rates[i]`, drawn from the reset seed, after one action
(L or R, ignored). Since no policy can change the odds, what a run measures on it is only where the task
source sends episodes: e.g. with rates [1, 1, 0.5, 0.5] SPO's curriculum (`tasks.order = "spo"`) should spend
more of them on the uncertain half than `random` does.
"""
from __future__ import annotations

import random

from turnstream.actors.environment import Environment, Reset, Step, register


@register("fixed_odds")
class FixedOdds(Environment):
    action_tokens = ["L", "R"]
    max_action_tokens = 1

    def __init__(self, success_rates: list[float] | None = None):
        self.success_rates = [float(p) for p in (success_rates or [1.0, 1.0, 0.5, 0.5])]
        if not all(0.0 <= p <= 1.0 for p in self.success_rates):
            raise ValueError(f"success_rates must lie in [0, 1], got {self.success_rates}")
        self.num_tasks = len(self.success_rates)
        self.task, self.rng = 0, random.Random(0)

    async def reset(self, seed: int, task: int | None = None) -> Reset:
        self.rng = random.Random(seed)
        self.task = self.rng.randrange(self.num_tasks) if task is None else task
        if not 0 <= self.task < self.num_tasks:
            raise ValueError(f"task {task} out of range [0, {self.num_tasks})")
        return Reset(observation=f"coin {self.task}", prompt_key=f"fixed_odds/{self.task}")

    async def step(self, action: str) -> Step:
        success = self.rng.random() < self.success_rates[self.task]
        return Step(observation="", reward=float(success), done=True, info={"success": success})
