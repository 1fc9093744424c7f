"""The player of the run's environment, chosen once when the actor starts."""
from __future__ import annotations

import functools

from turnstream.actors.envs.guard.hosts import host_for
from turnstream.actors.envs.guard.settings import GuardSettings
from turnstream.actors.play.env_loop import EnvironmentLoop
from turnstream.actors.play.player import EpisodePlayer
from turnstream.actors.registry import resolve


def player_for(name: str, args: dict, guard: GuardSettings | None = None) -> EpisodePlayer:
    """A name registered as an `EpisodePlayer` class (agent, verifiers) plays its own episodes: made once,
    here. Any other factory makes an `Environment` per episode, which the environment loop plays under
    `guard` (time limits, isolation; default: the defaults of [env]), on the actor's loop or in workers."""
    factory = resolve(name)
    if isinstance(factory, type) and issubclass(factory, EpisodePlayer):
        return factory(**args)
    guard = guard or GuardSettings(name)
    make_env = functools.partial(factory, **args)
    return EnvironmentLoop(make_env, guard, host_for(name, args, make_env, guard))
