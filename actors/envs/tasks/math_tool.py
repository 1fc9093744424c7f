"""A tool-use arithmetic task in the spirit of Math-TIR.

The observation poses a problem ("compute 37*48-19"). Each turn the model either calls the tool with an
expression, `calc <expression>` (or a bare expression), and gets the evaluator's result back as the next
observation ("result 1757"), or answers with `answer <number>`, which ends the episode: reward 1 if the
number is right, 0 otherwise. Expressions run in the subprocess sandbox of `actors.envs.tasks.sandbox` (CPU,
memory and wall-time limits, no files, no network). An action other than an answer after `max_tool_calls`
calls truncates the episode. `tool_penalty` (default 0) is subtracted per tool call, a per-turn reward. Every
step's info carries `tool_calls`, the replies so far that were not an answer and got a reply (a refused one does
not count), so the last one is the episode's figure (docs/environments.md, "What Step.info numbers become").

`system` is the system turn that tells a chat model how to call the tool (empty: the chat template's default,
for a model trained on this format). With `questions` > 0 the environment enumerates that many problems as its tasks (task i is the
problem of seed i), so held-out evaluation (`tasks.eval_split`) can keep some from training. `question` is the
user turn, with `{expression}` in the place of the problem.
"""
from __future__ import annotations

import random
import re

from turnstream.actors.environment import Environment, Reset, Step, register
from turnstream.actors.envs.tasks.sandbox import evaluate

_ANSWER = re.compile(r"answer(?:\s+is)?\s*[:=]?\s*\**\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_IS_THE_ANSWER = re.compile(r"(-?\d+(?:\.\d+)?)\s+is\s+the\s+(?:final\s+)?answer", re.IGNORECASE)
_BARE_NUMBER = re.compile(r"\s*\**\s*(-?\d+(?:\.\d+)?)\s*\**\.?\s*")
_EXPRESSION = re.compile(r"\(*-?\d+(?:\.\d+)?\)*(?:\s*[-+*/]\s*\(*-?\d+(?:\.\d+)?\)*)+")
SYSTEM = ("You have a calculator. To use it, reply with calc and an expression, for example: calc 12*34. You will "
          "get the result. When you know the final answer, reply with answer and the number.")
_CALL = re.compile(r"^\s*(?:calc|python|tool)\s*:?\s*(.+)$", re.IGNORECASE | re.DOTALL)


def make_problem(seed: int, terms: int, max_operand: int = 99, operators: str = "+-*") -> tuple[str, int]:
    rng = random.Random(seed)
    expr = str(rng.randint(2, max_operand))
    for _ in range(terms - 1):
        expr += rng.choice(operators) + str(rng.randint(2, max_operand))
    return expr, eval(expr, {"__builtins__": {}})  # our own digits and + - * only


def parse_action(action: str) -> tuple[str, str]:
    """("answer", number) or ("call", expression) or ("invalid", text), read as a user would: a reply that
    is only a number answers (nothing is left to compute), and one that writes an arithmetic expression anywhere,
    without stating an answer, asks for it to be computed."""
    m = _ANSWER.search(action) or _BARE_NUMBER.fullmatch(action) or _IS_THE_ANSWER.search(action)
    if m:
        return "answer", m.group(1)
    m = _CALL.match(action)
    if m:
        expression = m.group(1).strip()
    else:  # "75+64 = 149": the sum it wrote is what it wants computed
        written = _EXPRESSION.search(action)
        expression = written.group(0) if written else action.strip()
    if expression and re.fullmatch(r"[\d\s+\-*/%().,a-z_]+", expression):
        return "call", expression
    return "invalid", action


@register("math_tool")
class MathTool(Environment):
    max_action_tokens = 32

    def __init__(self, terms: list[int] | None = None, max_tool_calls: int = 3, tool_penalty: float = 0.0,
                 cpu_s: int = 1, wall_s: float = 3.0, system: str = SYSTEM, questions: int = 0,
                 question: str = "compute {expression}", max_operand: int = 99, operators: str = "+-*"):
        self.terms = terms or [2, 3]
        self.max_tool_calls, self.tool_penalty = max_tool_calls, tool_penalty
        self.cpu_s, self.wall_s = cpu_s, wall_s
        self.system, self.questions, self.question = system, questions, question
        self.max_operand, self.operators = max_operand, operators
        self.answer = 0
        self.calls = 0

    @property
    def num_tasks(self) -> int | None:
        return self.questions or None

    async def reset(self, seed: int, task: int | None = None) -> Reset:
        problem_seed = seed if task is None else task
        expr, self.answer = make_problem(problem_seed, random.Random(problem_seed).choice(self.terms),
                                         self.max_operand, self.operators)
        self.calls = 0
        return Reset(observation=self.question.format(expression=expr), prompt_key=f"math_tool/{expr}", system=self.system or None)

    async def step(self, action: str) -> Step:
        kind, payload = parse_action(action)
        if kind == "answer":
            correct = float(payload) == self.answer
            return Step("end", 1.0 if correct else 0.0, done=True, info={"success": correct, "tool_calls": self.calls})
        self.calls += 1
        if self.calls > self.max_tool_calls:  # the budget is spent and still no answer; this call is not run
            return Step("end", -self.tool_penalty, done=True, truncated=True,
                        info={"success": False, "tool_calls": self.max_tool_calls})
        if kind == "call":
            result = await evaluate(payload, cpu_s=self.cpu_s, wall_s=self.wall_s)
            observation = f"result {result.text}" if result.ok else result.text
        else:
            observation = "Reply with calc and an expression to use the calculator, or with answer and a number."
        return Step(observation, -self.tool_penalty, done=False, info={"success": False, "tool_calls": self.calls})
