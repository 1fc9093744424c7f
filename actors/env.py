"""The environment interface and the name registry (built-ins plus entry points).

An environment speaks text; the actor owns tokenisation so that the conversation's token ids are
built incrementally and never re-tokenised. `action_tokens`, when set, restricts sampling to those
tokens (vLLM `allowed_token_ids`); the learner applies the same mask.

Several agents: an environment with `num_agents > 1` says in every `Reset`/`Step` which agent acts next
(`agent`) and may hand rewards to any agent (`rewards`). Each agent keeps its own conversation, so the
runner streams one token stream per agent (agent id on every chunk); all agents sample from the same
policy server fleet (a shared policy).

Registry: `@register("name")` for environments shipped here; a user package adds environments without
touching turnstream through the entry-point group `turnstream.environments`, e.g. in its pyproject.toml:

    [project.entry-points."turnstream.environments"]
    my_maze = "my_pkg.envs:MyMaze"
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Callable

log = logging.getLogger("turnstream.actor")

ENTRY_POINT_GROUP = "turnstream.environments"


@dataclass
class Reset:
    observation: str
    prompt_key: str  # identifies the task instance for per-prompt baselines (SPO) and grouping
    agent: int = 0  # who acts first


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

    async def reset(self, seed: int) -> Reset:
        raise NotImplementedError

    async def step(self, action: str) -> Step:
        raise NotImplementedError

    async def close(self) -> None:
        return None


class EnvError(RuntimeError):
    """An environment failed in a way that abandons the episode but not the actor (e.g. its server died)."""

    def __init__(self, message: str, kind: str = "error"):
        super().__init__(message)
        self.kind = kind  # metric label: timeout, http_status, malformed, connection, ...


_REGISTRY: dict[str, Callable[..., Environment]] = {}


def register(name: str):
    def deco(factory):
        _REGISTRY[name] = factory
        return factory

    return deco


def _entry_points() -> dict[str, object]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def resolve(name: str) -> Callable[..., Environment]:
    """The factory for `name`: built-ins first (a plugin cannot shadow a shipped environment)."""
    import turnstream.actors.envs  # noqa: F401  (registers the shipped environments)

    if name in _REGISTRY:
        return _REGISTRY[name]
    ep = _entry_points().get(name)
    if ep is None:
        raise KeyError(f"unknown environment {name!r}; known: {', '.join(known_envs())}")
    try:
        factory = ep.load()  # type: ignore[attr-defined]
    except Exception as exc:  # a broken plugin must say which one
        raise KeyError(f"environment {name!r} from entry point {ep.value!r} failed to load: {exc!r}") from None
    _REGISTRY[name] = factory
    return factory


def make_env(name: str, /, **kwargs) -> Environment:
    return resolve(name)(**kwargs)


def known_envs() -> list[str]:
    import turnstream.actors.envs  # noqa: F401

    return sorted(set(_REGISTRY) | set(_entry_points()))


def describe(name: str) -> str:
    """One line about environment `name`: the factory's `description` (a string, or a callable returning
    one, e.g. to say that a library is missing), else the first line of its or its module's docstring.
    Never raises: a plug-in that fails to load is described by its error."""
    import sys

    try:
        factory = resolve(name)
    except KeyError as exc:
        return str(exc.args[0]) if exc.args else "failed to load"
    try:
        text = getattr(factory, "description", None)
        text = text() if callable(text) else text
        module = sys.modules.get(getattr(factory, "__module__", ""), None)
        text = text or getattr(factory, "__doc__", None) or getattr(module, "__doc__", None) or ""
    except Exception as exc:  # a plug-in's description must not break the listing
        return f"description failed: {exc!r}"
    return str(text).strip().split("\n")[0]
