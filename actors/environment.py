"""The environment interface, and `@register` for the environments shipped in actors/envs/.

An environment speaks text; the actor owns tokenisation so that the conversation's token ids are
built incrementally and never re-tokenised. `action_tokens`, when set, restricts sampling to those
tokens (vLLM `allowed_token_ids`); the learner applies the same mask.

Several agents: an environment with `num_agents > 1` says in every `Reset`/`Step` which agent acts next
(`agent`) and may hand rewards to any agent (`rewards`). Each agent keeps its own conversation, so the
environment loop (actors/play/env_loop.py) streams one token stream per agent (agent id on every chunk); all
agents sample from the same policy server fleet (a shared policy).

Tasks: an environment may enumerate its tasks (`num_tasks`, a class or instance attribute); then the actor's
task source (actors/tasks/) may reset it to a chosen one, `reset(seed, task=i)` with i in [0, num_tasks).
One that does not (num_tasks None) is only ever reset with a seed, `reset(seed)`, and the seed names the task:
two resets with the same seed give the same task instance.

Time limits: the run's env.reset_timeout_s, env.step_timeout_s and env.close_timeout_s bound every call; an
environment that knows its tool may say its own (the attributes below, class or instance; None: the run's),
and its own win. A call past its limit abandons the episode as an `EnvError` of kind `timeout`
(actors/envs/guard/). Under env.isolation = "process" the environment runs in a worker process, so every
attribute the loop reads must be plain data (numbers, strings, lists), and so must `Step.info`.

Names are looked up in actors/envs/registry.py (these built-ins, then the entry points of other packages).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass
class Reset:
    observation: str
    prompt_key: str  # identifies the task instance for per-prompt baselines (SPO) and grouping
    agent: int = 0  # who acts first
    system: str | None = None  # the system turn of every agent's conversation; None: the chat template's default


@dataclass
class Step:
    observation: str  # what the next acting agent (`agent`) sees
    reward: float  # reward for the agent that just acted
    done: bool
    truncated: bool = False  # ended by a limit, not by the task (a time limit, a turn budget)
    info: dict | None = None
    agent: int | None = None  # who acts next; None: the same agent again
    rewards: dict[int, float] | None = None  # rewards for other agents too (e.g. the loser of a game)


class Environment:
    """One episode at a time; create one instance per concurrent episode."""

    action_tokens: list[str] | None = None  # restrict sampling to these single-token strings
    max_action_tokens: int = 16
    num_agents: int = 1
    num_tasks: int | None = None  # tasks reset(seed, task) can name; None: the environment does not enumerate
    # own time limits in seconds (> 0), which win over the run's env.*_timeout_s; None: the run's
    reset_timeout_s: float | None = None
    step_timeout_s: float | None = None
    close_timeout_s: float | None = None

    async def reset(self, seed: int, task: int | None = None) -> Reset:
        """Start an episode; `task` (only given when num_tasks is set) picks the task, `seed` the rest."""
        raise NotImplementedError

    async def step(self, action: str) -> Step:
        raise NotImplementedError

    async def close(self) -> None:
        return None


class EnvError(RuntimeError):
    """An environment failed in a way that abandons the episode but not the actor (e.g. its server died)."""

    def __init__(self, message: str, kind: str = "error"):
        super().__init__(message)
        self.kind = kind  # metric label: timeout, worker_died, worker_memory, http_status, malformed, ...


REGISTERED: dict[str, Callable[..., Environment]] = {}


def register(name: str):
    def deco(factory):
        REGISTERED[name] = factory
        return factory

    return deco
