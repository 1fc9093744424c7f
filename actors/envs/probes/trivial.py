"""A trivial environment for throughput benchmarks: a fixed prompt, `turns` free-text turns, reward 0."""
from __future__ import annotations

from turnstream.actors.environment import Environment, Reset, Step, register


@register("trivial")
class Trivial(Environment):
    def __init__(self, turns: int = 1, max_action_tokens: int = 16, prompt: str = "say something"):
        self.turns, self.max_action_tokens, self.prompt = turns, max_action_tokens, prompt
        self.turn = 0

    async def reset(self, seed: int) -> Reset:
        self.turn = 0
        return Reset(observation=self.prompt, prompt_key="trivial")

    async def step(self, action: str) -> Step:
        self.turn += 1
        return Step(observation=self.prompt, reward=0.0, done=self.turn >= self.turns)
