"""Plays an episode whose loop is a user's function (`env.name = "agent"`, actors/envs/agent.py).

The runner's slot (actors/runner.py) hands the episode here instead of stepping an environment: the user's
`async def solve(client, task) -> float` gets an `openai.AsyncOpenAI` client whose base URL is the episode's
own on the actor's endpoint (actors/openai_endpoint.py), every chat call of it is one streamed turn, and
its return value is the episode's final reward (added to any the reward route reported).

An exception from the user's function (or a return value that is not a number, or running past the time
limit) abandons the episode: counted in `turnstream_actor_agent_errors_total` by reason, the turns already
streamed left for the buffer to drop as abandoned after its timeout, and the actor goes on. The exception
that follows a truncation (the call past the context answered 400) keeps the truncated outcome.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from turnstream.actors.agent_episode import AgentEpisode
from turnstream.actors.loop_shared import LoopShared
from turnstream.actors.openai_endpoint import AgentMetrics, OpenAIEndpoint

log = logging.getLogger("turnstream.actor")

class AgentFailed(Exception):
    """A failure of the episode's player that names its own reason (the label of the agent errors counter)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


_endpoint: "LoopShared[OpenAIEndpoint]" = LoopShared("openai-endpoint", close=OpenAIEndpoint.close)


async def shared_endpoint(registry) -> OpenAIEndpoint:
    """The actor process's one endpoint (started by the first agent episode; the evaluation runner shares it)."""
    return await _endpoint.get(lambda: OpenAIEndpoint(AgentMetrics(registry)).start())


async def play_agent(runner, solve: Callable[..., Awaitable], task, *, episode_id: str, prompt_key: str,
                     streams: dict, success_at: float, timeout_s: float) -> str:
    """Play one episode of `task` with the user's `solve`; the outcome (the runner's episode labels, or
    agent_error)."""
    import openai  # the integrations extra; AgentEnv checked at construction that it is there

    async def run(endpoint: OpenAIEndpoint, base_url: str):
        if endpoint.http_client is None:
            # one connection pool for every episode's client (a new one costs ~50 ms), on aiohttp (openai's own
            # DefaultAioHttpClient): httpx's pool and h11 parser cost ~1 ms of CPU a call more, taken from
            # generation
            endpoint.http_client = openai.DefaultAioHttpClient(timeout=runner_timeout(runner))
            quiet_request_logs()
        client = openai.AsyncOpenAI(base_url=base_url, api_key="turnstream", http_client=endpoint.http_client)
        return await solve(client, task)

    return await play_at_endpoint(runner, run, episode_id=episode_id, prompt_key=prompt_key, streams=streams,
                                  success_at=success_at, timeout_s=timeout_s)


async def play_at_endpoint(runner, run: Callable[[OpenAIEndpoint, str], Awaitable], *, episode_id: str,
                           prompt_key: str, streams: dict, success_at: float, timeout_s: float) -> str:
    """Play one episode whose calls come to its base URL on the actor's endpoint: `run(endpoint, base_url)`
    plays it (in this process, or in a harness that calls over HTTP) and returns the reward."""
    endpoint = await shared_endpoint(runner.m.registry)
    episode = AgentEpisode(runner, endpoint.metrics, episode_id, prompt_key)
    endpoint.episodes[episode_id] = episode
    try:
        result = await asyncio.wait_for(run(endpoint, endpoint.base_url(episode_id)), timeout_s or None)
        reward = _reward(result)
    except Exception as exc:  # the user's code: never the actor's end
        if episode.outcome is not None:  # truncated, or ended by the reward route: the outcome stands
            return episode.outcome
        reason = "timeout" if isinstance(exc, asyncio.TimeoutError) else \
            exc.reason if isinstance(exc, AgentFailed) else type(exc).__name__
        endpoint.metrics.agent_errors.labels(reason).inc()
        log.warning("episode %s abandoned: the agent failed (%s): %s", episode_id, reason, exc)
        return "agent_error"
    finally:
        del endpoint.episodes[episode_id]
        if episode.stream is not None:  # what the slot reads: streamed chunks, prompt keys
            streams[0] = episode.stream
    outcome = await episode.finish(reward)
    return "success" if outcome == "done" and reward >= success_at else outcome


def quiet_request_logs() -> None:
    """The openai client's transport (httpx, httpx2 from openai 3) logs every request at INFO: a line per turn
    in the actor's log, and its CPU taken from the turns. Left as they are when the user set their level."""
    for name in ("httpx", "httpx2"):
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


def _reward(result) -> float:
    if isinstance(result, bool) or not isinstance(result, (int, float)):
        raise TypeError(f"the agent returned {type(result).__name__}, not a number (the episode's reward)")
    return float(result)


def runner_timeout(runner) -> float:
    """The client's per-call time limit: a turn waits for a server and generates (actor.request_timeout_s)."""
    fleet_timeout = getattr(getattr(runner.client, "timeout", None), "total", None)
    return float(fleet_timeout or 60.0) * 2
