"""A number-line walk with delayed reward: the demo task.

The first observation names the goal's direction and distance ("goal R at 3 pos 0"); later observations
carry only the position ("pos 1"), so the policy must attend back to the first turn. One action token
per turn, L or R. The episode ends on reaching the goal (reward 1), or after `distance + slack` turns,
or on stepping `distance` away the wrong way (reward 0). A uniformly random policy succeeds with
probability 2^-distance when slack is 0, so the task starts far below the demo's 0.9 target.
"""
from __future__ import annotations

import random

from turnstream.actors.environment import Environment, Reset, Step, register


@register("goal_walk")
class GoalWalk(Environment):
    action_tokens = ["L", "R"]
    max_action_tokens = 1

    def __init__(self, distances: list[int] | None = None, slack: int = 0, cue_every_turn: bool = False):
        self.distances = distances or [2, 3, 4]
        self.slack = slack
        self.cue_every_turn = cue_every_turn  # repeat the direction in later observations (an easier task)
        self.direction = "R"
        self.goal = 0
        self.pos = 0
        self.turns = 0
        self.max_turns = 0

    async def reset(self, seed: int) -> Reset:
        rng = random.Random(seed)
        direction = self.direction = rng.choice("LR")
        distance = rng.choice(self.distances)
        self.goal = distance if direction == "R" else -distance
        self.pos, self.turns, self.max_turns = 0, 0, distance + self.slack
        return Reset(observation=f"goal {direction} at {distance} pos 0", prompt_key=f"goal_walk/{direction}{distance}")

    async def step(self, action: str) -> Step:
        move = {"L": -1, "R": 1}.get(action.strip())
        self.turns += 1
        if move is None:
            return Step(observation="invalid", reward=0.0, done=True, info={"success": False, "invalid": True})
        self.pos += move
        observation = f"goal {self.direction} pos {self.pos}" if self.cue_every_turn else f"pos {self.pos}"
        if self.pos == self.goal:
            return Step(observation=observation, reward=1.0, done=True, info={"success": True})
        lost = self.pos == -self.goal or self.turns >= self.max_turns
        return Step(observation=observation, reward=0.0, done=lost, info={"success": False})
