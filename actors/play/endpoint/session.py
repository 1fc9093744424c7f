"""One episode played at the actor's OpenAI-compatible endpoint: the episode gets its own base URL there,
whatever plays it (a user's agent function in this process, play/agent.py, or a verifiers rollout in a
harness worker, play/verifiers/) makes chat calls to it, each one streamed turn, and returns the reward
(added to any the reward route reported).

The time limits of an environment hold for the work of what plays it between its chat calls (its tool calls,
its environment's steps, its scoring): before its first call env.reset_timeout_s, from a reply to its next call
(or its return) env.step_timeout_s (`TurnLimits`); generation is not counted. `timeout_s` bounds the whole episode.

A failure of what plays it (an exception, a reward that is not a number, running past a time limit)
abandons the episode: counted in `turnstream_actor_agent_errors_total` by reason, the turns already
streamed left for the buffer to drop as abandoned after its timeout, and the actor goes on. The exception
that follows a truncation (the call past the context answered 400) keeps the truncated outcome.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from turnstream.actors.loop_shared import LoopShared
from turnstream.actors.play.context import PlayContext
from turnstream.actors.play.endpoint.episode import AgentEpisode
from turnstream.actors.play.endpoint.metrics import AgentMetrics
from turnstream.actors.play.endpoint.server import OpenAIEndpoint
from turnstream.actors.play.player import Episode, abandon_on_failure

log = logging.getLogger("turnstream.actor")


class AgentFailed(Exception):
    """A failure of the episode's player that names its own reason (the label of the agent errors counter)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class TurnLimits:
    """`first_s`: the player's work before its first chat call (env.reset_timeout_s); `between_s`: from a reply to
    its next call or its return (env.step_timeout_s)."""

    first_s: float = 60.0
    between_s: float = 60.0


_endpoint: "LoopShared[OpenAIEndpoint]" = LoopShared("openai-endpoint", close=OpenAIEndpoint.close)


async def shared_endpoint(ctx: PlayContext) -> OpenAIEndpoint:
    """The actor process's one endpoint, at `ctx.endpoint` (started by the first agent episode; evaluation
    episodes share it)."""
    return await _endpoint.get(lambda: OpenAIEndpoint(AgentMetrics(ctx.metrics.registry), ctx.endpoint).start())


async def play_at_endpoint(ctx: PlayContext, episode: Episode, run: Callable[[OpenAIEndpoint, str], Awaitable], *,
                           prompt_key: str, success_at: float, timeout_s: float,
                           limits: TurnLimits = TurnLimits()) -> str:
    """Play `episode`, whose calls come to its base URL on the actor's endpoint: `run(endpoint, base_url)`
    plays it and returns the reward; the outcome (success at a reward of `success_at` or more)."""
    return await abandon_on_failure(ctx, episode.episode_id, _play(ctx, episode, run, prompt_key=prompt_key,
                                                                    success_at=success_at, timeout_s=timeout_s,
                                                                    limits=limits))


async def _play(ctx: PlayContext, episode: Episode, run: Callable[[OpenAIEndpoint, str], Awaitable], *,
                prompt_key: str, success_at: float, timeout_s: float, limits: TurnLimits) -> str:
    episode_id = episode.episode_id
    endpoint = await shared_endpoint(ctx)
    played = AgentEpisode(ctx, endpoint.metrics, episode_id, prompt_key)
    endpoint.episodes[episode_id] = played
    try:
        result = await asyncio.wait_for(_within(run(endpoint, endpoint.base_url(episode_id)), limits, played),
                                        timeout_s or None)
        reward = _reward(result)
    except Exception as exc:  # the user's code: never the actor's end
        if played.outcome is not None:  # truncated, or ended by the reward route: the outcome stands
            return played.outcome
        reason = "timeout" if isinstance(exc, asyncio.TimeoutError) else \
            exc.reason if isinstance(exc, AgentFailed) else type(exc).__name__
        endpoint.metrics.agent_errors.labels(reason).inc()
        log.warning("episode %s abandoned: the agent failed (%s): %s", episode_id, reason, exc)
        return "agent_error"
    finally:
        del endpoint.episodes[episode_id]
        if played.stream is not None:  # what the slot reads: streamed chunks, prompt keys
            episode.streams[0] = played.stream
    outcome = await played.finish(reward)
    return "success" if outcome == "done" and reward >= success_at else outcome


async def _within(playing: Awaitable, limits: TurnLimits, played: AgentEpisode):
    """`playing`'s result, or AgentFailed("timeout") once its own work between calls passes `limits`."""
    runner = asyncio.ensure_future(playing)
    limiter = asyncio.ensure_future(_held_to(limits, played))
    try:
        await asyncio.wait({runner, limiter}, return_when=asyncio.FIRST_COMPLETED)
        return runner.result() if runner.done() else limiter.result()
    finally:
        for task in (runner, limiter):
            task.cancel()
        await asyncio.gather(runner, limiter, return_exceptions=True)


async def _held_to(limits: TurnLimits, played: AgentEpisode) -> None:
    """Raises AgentFailed("timeout") when the player has held the turn (no chat call in progress) past its limit;
    wakes once per limit, or when a call ends."""
    while True:
        if played.calls_open:
            await played.no_call.wait()
            continue
        first = played.turns == 0
        limit_s, field = (limits.first_s, "env.reset_timeout_s") if first else (limits.between_s, "env.step_timeout_s")
        left = played.agent_since + limit_s - time.monotonic()
        if left <= 0:
            raise AgentFailed("timeout", f"{'before its first chat call' if first else 'after a reply'} it made no "
                                         f"call nor returned within {field} ({limit_s:g}s)")
        await asyncio.sleep(left)


def _reward(result) -> float:
    if isinstance(result, bool) or not isinstance(result, (int, float)):
        raise TypeError(f"the agent returned {type(result).__name__}, not a number (the episode's reward)")
    return float(result)
