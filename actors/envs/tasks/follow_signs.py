"""Follow the signs: the demo task. Multi-turn, reward only at the end.

At each of `k` junctions the observation shows a sign ("junction 2 sign L") and the agent answers with
one token, L or R. The episode always runs all k turns; the reward, 1 if every turn followed its sign
and 0 otherwise, comes only after the last one, so the learner must assign credit across turns.

Why this task and not a walk towards a goal named once: when success needs k consecutive right moves
toward a fixed side, a policy that ignores the observation and always picks one side earns 50%, and
the policy gradient at a near-uniform start points toward that constant policy (success is a product
of per-turn probabilities, so consistency pays before conditioning does). Here the signs are drawn
independently per turn, so any observation-blind policy succeeds with probability exactly 2^-k and the
only way up is to read the observation.

Its tasks are the sign sequences: every string of L and R of each length in `junctions`, shortest first
(`num_tasks` of them), so a sequential task order visits each once per epoch. Without a task, the seed draws
the length and the signs, as always.
"""
from __future__ import annotations

import random

from turnstream.actors.environment import Environment, Reset, Step, register


@register("follow_signs")
class FollowSigns(Environment):
    action_tokens = ["L", "R"]
    max_action_tokens = 1
    name = "follow_signs"  # prompt_key's prefix

    def __init__(self, junctions: list[int] | None = None):
        self.junctions = junctions or [2, 3, 4]
        self.signs = ""
        self.plan: list[str | None] = []  # per turn: the sign to follow, or None for a turn without one
        self.turn = 0
        self.all_followed = True

    @property
    def num_tasks(self) -> int:
        return sum(2 ** k for k in self._lengths())

    def _lengths(self) -> list[int]:
        return sorted(set(self.junctions))

    def task_signs(self, task: int) -> str:
        """The sign sequence of task `task`: within one length, task i's signs spell i in binary (L = 0)."""
        if not 0 <= task < self.num_tasks:
            raise ValueError(f"task {task} out of range [0, {self.num_tasks})")
        for k in self._lengths():
            if task < 2 ** k:
                return format(task, f"0{k}b").replace("0", "L").replace("1", "R")
            task -= 2 ** k
        raise AssertionError("unreachable")

    async def reset(self, seed: int, task: int | None = None) -> Reset:
        rng = random.Random(seed)
        if task is None:
            k = rng.choice(self.junctions)
            self.signs = "".join(rng.choice("LR") for _ in range(k))
        else:
            self.signs = self.task_signs(task)
        self.plan = self._plan(rng)
        self.turn, self.all_followed = 0, True
        return Reset(observation=self._observation(), prompt_key=f"{self.name}/{self.signs}")

    def _plan(self, rng: random.Random) -> list[str | None]:
        return list(self.signs)

    @property
    def num_turns(self) -> int:
        return len(self.plan)

    def _observation(self) -> str:
        sign = self.plan[self.turn]
        if sign is None:
            return f"corridor {self.turn + 1} no sign"
        return f"junction {self.turn + 1} sign {sign}"

    async def step(self, action: str) -> Step:
        sign = self.plan[self.turn]
        if sign is not None:
            self.all_followed &= action.strip() == sign
        self.turn += 1
        if self.turn == len(self.plan):
            success = self.all_followed
            return Step(observation="end", reward=1.0 if success else 0.0, done=True, info={"success": success})
        return Step(observation=self._observation(), reward=0.0, done=False)
