"""Plays episodes: K concurrent slots, each waits for a credit, draws a task, plays one episode with the
actor's player (play/player.py) and reports it played once the buffer holds its chunks."""
from __future__ import annotations

import asyncio
import itertools
import time
from typing import Protocol, Sequence

from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.context import PlayContext, Sampling
from turnstream.actors.play.endpoint.address import EndpointAddress
from turnstream.actors.play.player import Episode, EpisodePlayer
from turnstream.actors.play.stream import Stream
from turnstream.actors.tasks.orders import Assignment


class Tasks(Protocol):
    """What the slots draw from: a task source (actors/tasks/source.py), in the actor process behind the
    graceful stop's DrainableTasks (actors/drain.py)."""

    def next(self) -> Assignment | None: ...

    def played(self, assignment: Assignment, prompt_keys: Sequence[str]) -> None: ...


class EpisodeRunner:
    def __init__(self, *, actor_id: str, epoch: int, player: EpisodePlayer, chat: ChatTokens, client, link,
                 sampling: Sampling, metrics: ActorMetrics, tasks: Tasks, frozen_clients: dict | None = None,
                 request_timeout_s: float = 60.0, endpoint: EndpointAddress = EndpointAddress()):
        self.player = player
        self.context = PlayContext(actor_id, epoch, chat, client, link, sampling, metrics,
                                   frozen_clients=frozen_clients or {}, request_timeout_s=request_timeout_s,
                                   endpoint=endpoint)
        self._episode_counter = itertools.count()
        self.tasks = tasks  # what each new episode plays (actors/tasks/)

    async def run(self, concurrent_episodes: int) -> None:
        """Play until the task source runs out (never, for an unlimited order)."""
        await asyncio.gather(*(self._slot() for _ in range(concurrent_episodes)))

    async def _slot(self) -> None:
        ctx, m = self.context, self.context.metrics
        while True:
            waiting_since = time.monotonic()
            granted_by = await ctx.link.acquire_credit()
            m.credit_wait_seconds.inc(time.monotonic() - waiting_since)
            # drawn after the credit, so that consecutive episodes (a group) start together
            assignment = self.tasks.next()
            if assignment is None:
                await ctx.link.return_credit(granted_by)
                return
            n = next(self._episode_counter)
            streams: dict[int, Stream] = {}
            m.running.inc()
            try:
                outcome = await self.play(f"{ctx.actor_id}-{ctx.epoch}-{n}", seed=assignment.seed,
                                          task=assignment.task, streams=streams)
            finally:
                m.running.dec()
            # the task source counts a draw as played once the buffer holds its episodes: a draw whose chunks
            # die with this process is played again by the next one (actors/tasks/position.py)
            await ctx.link.delivered(max((s.last_seq for s in streams.values()), default=-1))
            self.tasks.played(assignment, [s.prompt_key for s in streams.values()])
            if not any(s.turn for s in streams.values()):  # nothing streamed: the buffer never saw it start
                await ctx.link.return_credit(granted_by)
            m.episodes.labels(outcome).inc()

    async def play(self, episode_id: str, seed: int, task: int | None = None,
                   streams: dict[int, Stream] | None = None) -> str:
        """Play one episode of `task` (None: the seed is the task); `streams` (agent id -> stream) is filled as
        agents act, for the caller to see what was streamed."""
        return await self.player.play(self.context, Episode(episode_id, seed, task, {} if streams is None
                                                            else streams))
