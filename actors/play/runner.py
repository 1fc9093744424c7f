"""Plays episodes: while the gate has room (play/in_flight.py: K that want generation, more while some wait on
their environment), take a credit, draw a task and start an episode, which plays with the actor's player
(play/player.py) and reports itself played once the buffer holds its chunks; the numbers its environment
reported about it (play/episode_figures.py) go to the actor's metrics."""
from __future__ import annotations

import asyncio
import itertools
import time
from typing import Protocol, Sequence

from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.context import PlayContext, Sampling
from turnstream.actors.play.endpoint.address import EndpointAddress
from turnstream.actors.play.in_flight import EpisodeGate
from turnstream.actors.play.player import Episode, EpisodePlayer
from turnstream.actors.play.stream import Stream
from turnstream.actors.tasks.orders import Assignment
from turnstream.core.config_inference import auto_max_in_flight

# the outcomes of an episode that failed (play/player.py): its last turn never reached the buffer as done
ABANDONED = frozenset({"abandoned", "env_error", "agent_error"})


class Tasks(Protocol):
    """What the episodes draw from: a task source (actors/tasks/source.py), in the actor process behind the
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

    async def run(self, concurrent_episodes: int, max_in_flight: int = 0, buffer_expiry_s: float = 60.0) -> None:
        """Play until the task source runs out (never, for an unlimited order): `concurrent_episodes` (K) that
        want generation at once, and up to `max_in_flight` in all (0: auto) while some wait on their environment;
        `buffer_expiry_s`: the buffer's episode timeout (play/in_flight.py)."""
        ctx = self.context
        gate = EpisodeGate(concurrent_episodes, max_in_flight or auto_max_in_flight(concurrent_episodes),
                           ctx.metrics.episodes_waiting_on_env, buffer_expiry_s=buffer_expiry_s)
        async with asyncio.TaskGroup() as episodes:
            while True:
                await gate.enter()
                ctx.link.want_slots(gate.slots())
                waiting_since = time.monotonic()
                granted_by = await ctx.link.acquire_credit()
                ctx.metrics.credit_wait_seconds.inc(time.monotonic() - waiting_since)
                # drawn after the credit, so that consecutive episodes (a group) start together
                assignment = self.tasks.next()
                if assignment is None:
                    await ctx.link.return_credit(granted_by)
                    gate.leave()
                    break  # and wait for the episodes in flight
                episodes.create_task(self._episode(gate, assignment, granted_by))
        ctx.link.want_slots(gate.slots())

    async def _episode(self, gate: EpisodeGate, assignment: Assignment, granted_by: str) -> None:
        gate.adopt_current_task()
        try:
            if await self._play_assignment(assignment, granted_by):
                gate.abandoned_midway()
        finally:
            gate.leave()
            self.context.link.want_slots(gate.slots())

    async def _play_assignment(self, assignment: Assignment, granted_by: str) -> bool:
        """Play one episode of `assignment`; whether it was abandoned after it had streamed turns."""
        ctx, m = self.context, self.context.metrics
        n = next(self._episode_counter)
        episode = Episode(f"{ctx.actor_id}-{ctx.epoch}-{n}", assignment.seed, assignment.task)
        streams = episode.streams
        m.running.inc()
        try:
            outcome = await self.player.play(ctx, episode)
        finally:
            m.running.dec()
        # the task source counts a draw as played once the buffer holds its episodes: a draw whose chunks
        # die with this process is played again by the next one (actors/tasks/position.py)
        await ctx.link.delivered(max((s.last_seq for s in streams.values()), default=-1))
        self.tasks.played(assignment, [s.prompt_key for s in streams.values()])
        streamed = any(s.turn for s in streams.values())
        if not streamed:  # nothing streamed: the buffer never saw it start
            await ctx.link.return_credit(granted_by)
        m.episodes.labels(outcome).inc()
        m.episode_info.observe(episode.figures.values)
        return streamed and outcome in ABANDONED

    async def play(self, episode_id: str, seed: int, task: int | None = None,
                   streams: dict[int, Stream] | None = None) -> str:
        """Play one episode of `task` (None: the seed is the task); `streams` (agent id -> stream) is filled as
        agents act, for the caller to see what was streamed."""
        return await self.player.play(self.context, Episode(episode_id, seed, task, {} if streams is None
                                                            else streams))
