"""The player of the run's environment, chosen once when the actor starts."""
from __future__ import annotations

import functools

from turnstream.actors.play.env_loop import EnvironmentLoop
from turnstream.actors.play.player import EpisodePlayer
from turnstream.actors.registry import resolve


def player_for(name: str, args: dict) -> EpisodePlayer:
    """A name registered as an `EpisodePlayer` class (agent, verifiers) plays its own episodes: made once,
    here. Any other factory makes an `Environment` per episode, which the environment loop plays."""
    factory = resolve(name)
    if isinstance(factory, type) and issubclass(factory, EpisodePlayer):
        return factory(**args)
    return EnvironmentLoop(functools.partial(factory, **args))
