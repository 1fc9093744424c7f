"""The environment interface and a name registry.

An environment speaks text; the actor owns tokenisation so that the conversation's token ids are
built incrementally and never re-tokenised. `action_tokens`, when set, restricts sampling to those
tokens (vLLM `allowed_token_ids`); the learner applies the same mask.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass
class Reset:
    observation: str
    prompt_key: str  # identifies the task instance for per-prompt baselines (SPO) and grouping


@dataclass
class Step:
    observation: str
    reward: float
    done: bool
    truncated: bool = False
    info: dict | None = None


class Environment:
    """One episode at a time; create one instance per concurrent episode."""

    action_tokens: list[str] | None = None  # restrict sampling to these single-token strings
    max_action_tokens: int = 16

    async def reset(self, seed: int) -> Reset:
        raise NotImplementedError

    async def step(self, action: str) -> Step:
        raise NotImplementedError

    async def close(self) -> None:
        return None


_REGISTRY: dict[str, Callable[..., Environment]] = {}


def register(name: str):
    def deco(factory):
        _REGISTRY[name] = factory
        return factory

    return deco


def make_env(name: str, **kwargs) -> Environment:
    import actors.envs  # noqa: F401  (registers the shipped environments)

    if name not in _REGISTRY:
        raise KeyError(f"unknown environment {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name](**kwargs)


def known_envs() -> list[str]:
    import actors.envs  # noqa: F401

    return sorted(_REGISTRY)
