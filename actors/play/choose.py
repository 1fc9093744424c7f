"""The player of the run's environment, chosen once when the actor starts."""
from __future__ import annotations

import functools
import logging

from turnstream.actors.envs.guard.hosts import host_for
from turnstream.actors.envs.guard.settings import GuardSettings
from turnstream.actors.play.env_loop import EnvironmentLoop
from turnstream.actors.play.player import EpisodePlayer
from turnstream.actors.envs.registry import resolve

log = logging.getLogger("turnstream.actor")


def player_for(name: str, args: dict, guard: GuardSettings | None = None) -> EpisodePlayer:
    """A name registered as an `EpisodePlayer` class (agent, verifiers) plays its own episodes: made once,
    here. Any other factory makes an `Environment` per episode, which the environment loop plays. Either plays
    under `guard` (time limits, isolation; default: the defaults of [env]); the log says where its code runs,
    and an isolation the player cannot apply is a ConfigError."""
    factory = resolve(name)
    guard = guard or GuardSettings(name)
    player: EpisodePlayer
    if isinstance(factory, type) and issubclass(factory, EpisodePlayer):
        factory.check_isolation(guard.isolation, name)
        player = factory(**args)
    else:
        make_env = functools.partial(factory, **args)
        player = EnvironmentLoop(make_env, guard, host_for(name, args, make_env, guard))
    log.info("env %s: %s", name, player.guarded_by(guard))
    return player
