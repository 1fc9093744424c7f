"""The episode-player interface: how an actor plays one episode of the run's environment.

Three players ship: `EnvironmentLoop` (play/env_loop.py) resets and steps an `Environment`, sampling every
reply; `AgentPlayer` (play/agent.py) hands the episode to a user's agent function, whose chat calls reach
the actor's OpenAI-compatible endpoint (play/endpoint/); `VerifiersPlayer` (play/verifiers/) hands it to a
verifiers rollout in a harness worker, against the same endpoint. The actor picks one at start-up from the
environment's name (play/choose.py) and plays every episode with it.

A player returns the episode's outcome, the label of `turnstream_actor_episodes_total`: success, done,
truncated, or why it was abandoned (abandoned: inference failed; env_error: the environment failed;
agent_error: the user's agent or the verifiers rollout failed). A failure abandons one episode, never the
actor (`abandon_on_failure`).

Every player takes the run's guard settings ([env]: time limits, isolation; `guarded_by`) and says at start-up
where its episodes' code runs. A player names the `env.isolation` values it can apply (`isolations`); any other
is a config error (`check_isolation`, run by `turnstream check` and at the actor's start).
"""
from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Awaitable, ClassVar

from turnstream.actors.environment import EnvError
from turnstream.actors.envs.guard.settings import GuardSettings
from turnstream.actors.inference.client import InferenceError
from turnstream.actors.play.context import PlayContext
from turnstream.actors.play.episode_figures import EpisodeFigures
from turnstream.actors.play.stream import Stream
from turnstream.core.configtools import ConfigError

log = logging.getLogger("turnstream.actor")


@dataclass
class Episode:
    """One episode to play: `task` None means the seed is the task; `streams` (agent id -> stream) is filled
    as agents act, for the caller to see what was streamed; `figures`, set by a player whose environment reports
    them, are the numbers of the episode's last `Step.info` (play/episode_figures.py)."""

    episode_id: str
    seed: int
    task: int | None = None
    streams: dict[int, Stream] = field(default_factory=dict)
    figures: EpisodeFigures = field(default_factory=EpisodeFigures)


class EpisodePlayer(ABC):
    isolations: ClassVar[tuple[str, ...]] = ("loop", "process")  # the env.isolation values it can apply
    isolation_note: ClassVar[str] = ""  # why it applies no other (the config error's reason)

    @classmethod
    def check_isolation(cls, isolation: str, name: str) -> None:
        """ConfigError naming env.isolation and env.name when this player cannot apply `isolation`."""
        if isolation not in cls.isolations:
            raise ConfigError(f'env.isolation: "{isolation}" cannot apply to env.name = "{name}": '
                              f"{cls.isolation_note}")

    @abstractmethod
    def guarded_by(self, guard: GuardSettings) -> str:
        """Apply the run's guard settings (time limits); the start-up line saying where its episodes' code runs
        and under which limits."""

    @abstractmethod
    def startup_env(self):
        """An instance of the run's environment for the start-up questions (its task count, `num_tasks`)."""

    @abstractmethod
    async def play(self, ctx: PlayContext, episode: Episode) -> str:
        """Play `episode`, streaming each turn through `ctx`; the outcome."""


async def abandon_on_failure(ctx: PlayContext, episode_id: str, playing: Awaitable[str]) -> str:
    """The outcome of `playing`, or the reason it was abandoned: a failed generation or environment ends
    the episode (the buffer expires its partial chunks after its timeout and counts it abandoned)."""
    try:
        return await playing
    except InferenceError as exc:
        ctx.metrics.inference_errors.inc()
        log.warning("episode %s abandoned: %s", episode_id, exc)
        return "abandoned"
    except EnvError as exc:
        ctx.metrics.env_errors.labels(exc.kind).inc()
        log.warning("episode %s abandoned: environment failed (%s): %s", episode_id, exc.kind, exc)
        return "env_error"
    except Exception:  # an environment bug must not take the actor down
        ctx.metrics.env_errors.labels("exception").inc()
        log.exception("episode %s abandoned: environment error", episode_id)
        return "env_error"
