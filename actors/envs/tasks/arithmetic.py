"""Arithmetic in words for a pretrained chat model: one question, a free-text reply, reward 1 when the number
the reply states is right (read leniently: tasks/answers.py).

Single-turn by default. With `attempts` > 1 a wrong answer is told whether the right one is higher or lower
("No, the answer is higher than 11. Try again.") and the model answers again, up to `attempts` turns: feedback it
must read, since repeating or moving the wrong way wins nothing. Reward 1 for a right answer on any attempt.

Its tasks are the questions themselves (`num_tasks`, each seeded by its index), so held-out
evaluation (`tasks.eval_split`) keeps questions the policy never trained on.
"""
from __future__ import annotations

import operator
import random

from turnstream.actors.environment import Environment, Reset, Step, register
from turnstream.actors.envs.tasks.answers import last_number

_OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
SYSTEM = "You are a helpful assistant. Answer with the number only."


@register("arithmetic")
class Arithmetic(Environment):
    max_action_tokens = 64
    name = "arithmetic"

    def __init__(self, digits: int = 2, operators: str = "+-", questions: int = 1000, system: str = SYSTEM,
                 attempts: int = 1):
        if set(operators) - set(_OPERATORS) or not operators:
            raise ValueError(f"operators must be some of {''.join(_OPERATORS)}, got {operators!r}")
        self.digits, self.operators, self.questions, self.system = digits, operators, questions, system
        self.attempts, self.attempt = attempts, 0
        self.answer = 0

    @property
    def num_tasks(self) -> int:
        return self.questions

    def question(self, task: int) -> tuple[str, int]:
        rng = random.Random(f"{self.name}/{task}")
        a, b = (rng.randint(10 ** (self.digits - 1), 10 ** self.digits - 1) for _ in range(2))
        op = rng.choice(self.operators)
        return f"What is {a} {op} {b}?", _OPERATORS[op](a, b)

    async def reset(self, seed: int, task: int | None = None) -> Reset:
        task = random.Random(seed).randrange(self.questions) if task is None else task
        text, self.answer = self.question(task)
        self.attempt = 0
        return Reset(text, prompt_key=f"{self.name}/{task}", system=self.system or None)

    async def step(self, action: str) -> Step:
        self.attempt += 1
        stated = last_number(action)
        correct = stated == self.answer
        if correct or self.attempt >= self.attempts:
            return Step("", 1.0 if correct else 0.0, done=True, info={"success": correct, "attempts": self.attempt})
        if stated is None:
            feedback = "No number there. Try again."
        else:
            side = "higher" if self.answer > stated else "lower"
            feedback = f"No, the answer is {side} than {stated:g}. Try again."
        return Step(feedback, 0.0, done=False, info={"success": False, "attempts": self.attempt})
