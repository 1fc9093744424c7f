"""`reasoning_gym`: any reasoning-gym dataset as a single-turn or multi-turn task.

Its tasks are the dataset's questions (`num_tasks` is its length, the config's `size`): `reset(seed,
task=i)` asks question i; without a task the episode seed picks the question (`dataset[seed %
len(dataset)]`). The observation is the question's `question` (plus `instructions`, if set); the reply, or
the part between `<answer>` tags when `answer_format = "tagged"` (read with reasoning-gym's own
`extract_answer`), is scored by the dataset's own `score_answer`, and that score is the reward. With
`max_attempts > 1` a reply that scores below `success_score` is answered with the scorer's verdict and the
model tries again; the episode's reward is the score of its last attempt, given on the turn that ends it
(earlier turns get 0). Running out of attempts is an ordinary end (`done`), not a truncation: the task was
attempted and scored. Each question has its own `prompt_key`, so per-prompt baselines (SPO) track every
question; the config's `seed` defaults to 0 (reasoning-gym would draw a random one) so that every actor
process asks the same question under the same key. An exception from the dataset or its scorer abandons the
episode as an `EnvError` of kind `library`.
See docs/adapters/reasoning_gym.md.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from turnstream.actors.environment import EnvError, Environment, Reset, Step
from turnstream.actors.envs.adapters.common import check_task, describe, library_errors, require

LIBRARY, EXTRA = "reasoning_gym", "reasoning-gym"
TAGGED_INSTRUCTIONS = "Give only the final answer between <answer> and </answer>."


@dataclass
class ReasoningGymArgs:
    dataset: str = "basic_arithmetic"  # any name in reasoning_gym.factory.DATASETS
    config: dict = field(default_factory=dict)  # the dataset's config fields, e.g. {"size": 500, "seed": 1}
    max_attempts: int = 1  # 1: single-turn; more: a wrong answer gets the scorer's verdict and another try
    answer_format: Literal["plain", "tagged"] = "plain"
    instructions: str | None = None  # text after the question; None: a line about the tags when tagged
    success_score: float = 1.0  # a score at or above this ends the episode as a success
    max_action_tokens: int = 32

    def validate(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"reasoning_gym: max_attempts must be >= 1, got {self.max_attempts}")
        if self.answer_format not in ("plain", "tagged"):
            raise ValueError(f"reasoning_gym: answer_format must be plain or tagged, got {self.answer_format!r}")
        if self.max_action_tokens < 1:
            raise ValueError("reasoning_gym: max_action_tokens must be >= 1")


# Datasets are deterministic in (name, config); one instance per process serves every episode.
_DATASETS: dict[str, object] = {}


def load_dataset(rg, name: str, config: dict):
    key = repr((name, sorted(config.items())))
    if key not in _DATASETS:
        if name not in rg.factory.DATASETS:
            raise ValueError(f"reasoning_gym: unknown dataset {name!r} "
                             f"({len(rg.factory.DATASETS)} are registered in reasoning_gym.factory.DATASETS)")
        config_fields = {f.name for f in dataclasses.fields(rg.factory.DATASETS[name][1])}
        if "seed" in config_fields and "seed" not in config:
            # reasoning-gym draws a random seed when none is given; every actor process must see the same
            # question under the same prompt key
            config = {**config, "seed": 0}
        try:
            _DATASETS[key] = rg.create_dataset(name, **config)
        except (TypeError, ValueError, AssertionError) as exc:  # reasoning-gym validates configs with assert
            raise ValueError(f"reasoning_gym: {name} config {config}: {type(exc).__name__}: {exc}") from None
    return _DATASETS[key]


class ReasoningGymEnv(Environment):
    def __init__(self, **kwargs):
        self.args = ReasoningGymArgs(**kwargs)
        self.args.validate()
        self.rg = require(LIBRARY, EXTRA)
        self.dataset = load_dataset(self.rg, self.args.dataset, self.args.config)
        self.num_tasks = len(self.dataset)  # question i is task i
        self.max_action_tokens = self.args.max_action_tokens
        self.entry: dict | None = None
        self.attempts = 0

    @classmethod
    def description(cls) -> str:
        return describe("reasoning-gym datasets (any name and config), single- or multi-turn, scored by "
                        "the dataset", LIBRARY, EXTRA)

    def _instructions(self) -> str:
        if self.args.instructions is not None:
            return self.args.instructions
        return TAGGED_INSTRUCTIONS if self.args.answer_format == "tagged" else ""

    def extract(self, reply: str) -> str | None:
        if self.args.answer_format == "tagged":
            from reasoning_gym.utils import extract_answer

            return extract_answer(reply)
        return reply.strip()

    async def reset(self, seed: int, task: int | None = None) -> Reset:
        index = seed % len(self.dataset) if task is None else check_task(LIBRARY, task, self.num_tasks)
        with library_errors(LIBRARY, f"{self.args.dataset}[{index}]"):
            self.entry = self.dataset[index]
        self.attempts = 0
        question = str(self.entry["question"])
        text = f"{question}\n{self._instructions()}".strip()
        return Reset(observation=text, prompt_key=f"reasoning_gym/{self.args.dataset}/{index}")

    async def step(self, action: str) -> Step:
        if self.entry is None:
            raise EnvError("reasoning_gym: step before reset", "protocol")
        answer = self.extract(action)
        with library_errors(LIBRARY, f"{self.args.dataset} score_answer"):
            score = float(self.dataset.score_answer(answer=answer, entry=self.entry))
        self.attempts += 1
        solved = score >= self.args.success_score
        info = {"success": solved, "score": score, "attempts": self.attempts, "answer": answer}
        if solved or self.attempts >= self.args.max_attempts:
            return Step("correct" if solved else f"final score {score:g}", score, done=True, info=info)
        left = self.args.max_attempts - self.attempts
        verdict = ("no answer found between <answer> tags" if answer is None
                   else f"your answer scored {score:g} out of 1")
        return Step(f"{verdict}. Try again ({left} attempt{'s' if left > 1 else ''} left).", 0.0, done=False,
                    info=info)
