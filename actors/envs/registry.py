"""Environment names: the built-ins of actors/envs/ first, then other packages' entry points.

A user package adds environments without touching turnstream through the entry-point group
`turnstream.environments`, e.g. in its pyproject.toml:

    [project.entry-points."turnstream.environments"]
    my_maze = "my_pkg.envs:MyMaze"

A name's factory makes an `Environment`, which the environment loop plays, or is an `EpisodePlayer` class
that plays its own episodes (`agent`, `verifiers`); actors/play/choose.py tells them apart once, at start-up.
"""
from __future__ import annotations

import sys
from importlib.metadata import entry_points
from typing import Callable

import turnstream.actors.envs  # noqa: F401  (registers the shipped environments)
from turnstream.actors.environment import REGISTERED

# What a name stands for: a factory of an `Environment`, or an `EpisodePlayer` class (actors/play/player.py).
# Typed as `object` here: environments sit below the players that play them, and play/choose.py tells them apart.
Factory = Callable[..., object]

ENTRY_POINT_GROUP = "turnstream.environments"


def _entry_points() -> dict[str, object]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def resolve(name: str) -> Factory:
    """The factory for `name`: built-ins first (a plugin cannot shadow a shipped environment)."""
    if name in REGISTERED:
        return REGISTERED[name]
    ep = _entry_points().get(name)
    if ep is None:
        raise KeyError(f"unknown environment {name!r}; known: {', '.join(known_envs())}")
    try:
        factory = ep.load()  # type: ignore[attr-defined]
    except Exception as exc:  # a broken plugin must say which one
        raise KeyError(f"environment {name!r} from entry point {ep.value!r} failed to load: {exc!r}") from None
    REGISTERED[name] = factory
    return factory


def make_env(name: str, /, **kwargs) -> object:
    return resolve(name)(**kwargs)


def known_envs() -> list[str]:
    return sorted(set(REGISTERED) | set(_entry_points()))


def describe(name: str) -> str:
    """One line about environment `name`: the factory's `description` (a string, or a callable returning
    one, e.g. to say that a library is missing), else the first line of its or its module's docstring.
    Never raises: a plug-in that fails to load is described by its error."""
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
