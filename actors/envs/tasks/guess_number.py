"""Guess the number, for a pretrained chat model: multi-turn, with feedback the model must read.

The model has `max_guesses` turns to find a secret number in [1, `high`]; after each wrong guess it is told
"Higher." or "Lower." (a reply without a number is told so, and costs the turn). Reward 1 when it names the
number, 0 when the guesses run out. A policy that ignores the feedback and never repeats itself finds it with
probability max_guesses / high; reading the feedback (halving the range) finds it every time once
2^max_guesses > high.

Its tasks are the secret numbers (`num_tasks` = high), so held-out evaluation keeps numbers never trained on.
"""
from __future__ import annotations

import random

from turnstream.actors.environment import Environment, Reset, Step, register
from turnstream.actors.envs.tasks.answers import last_number

SYSTEM = "You are playing a guessing game. Reply with one number, your guess."


@register("guess_number")
class GuessNumber(Environment):
    max_action_tokens = 32
    name = "guess_number"

    def __init__(self, high: int = 20, max_guesses: int = 5, system: str = SYSTEM):
        self.high, self.max_guesses, self.system = high, max_guesses, system
        self.secret, self.guesses = 0, 0

    @property
    def num_tasks(self) -> int:
        return self.high

    async def reset(self, seed: int, task: int | None = None) -> Reset:
        task = random.Random(seed).randrange(self.high) if task is None else task
        self.secret, self.guesses = task + 1, 0
        prompt = (f"I am thinking of a whole number from 1 to {self.high}. Guess it. After each guess I will tell "
                  f"you whether my number is higher or lower. You have {self.max_guesses} guesses.")
        return Reset(prompt, prompt_key=f"{self.name}/{self.secret}", system=self.system or None)

    async def step(self, action: str) -> Step:
        self.guesses += 1
        guess = last_number(action)
        if guess == self.secret:
            return Step("", 1.0, done=True, info={"success": True, "guesses": self.guesses})
        if self.guesses >= self.max_guesses:
            return Step("", 0.0, done=True, info={"success": False, "guesses": self.guesses})
        left = self.max_guesses - self.guesses
        if guess is None:
            feedback = "That is not a number."
        else:
            feedback = "Higher." if self.secret > guess else "Lower."
        return Step(f"{feedback} {left} guess{'es' if left > 1 else ''} left.", 0.0, done=False,
                    info={"success": False, "guesses": self.guesses})
