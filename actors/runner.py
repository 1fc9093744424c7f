"""Plays episodes: K concurrent loops, each waits for a credit, plays one episode, streams each turn.

An episode with several agents is streamed as one token stream per agent (episode id `<id>/a<k>`, agent
id on every chunk): each agent has its own conversation, and the buffer assembles each stream as an
episode of its own, so the learner sees exactly the tokens that agent's context held. When the episode
ends, every other agent's stream is closed with a chunk that has no generated tokens and carries that
agent's outstanding reward (e.g. the loser's -1).

Agents share the trained policy unless listed in `frozen_clients`: those are played by a fixed policy on
other servers, and their turns reach the others only as observations; nothing of theirs is streamed.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass, field

import numpy as np

from turnstream.actors.chat import ChatTokens
from turnstream.actors.environment import EnvError, Environment, Step
from turnstream.actors.inference import Generation, InferenceError
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.tasks import TaskSource
from turnstream.protocol.messages import TurnChunk

log = logging.getLogger("turnstream.actor")


@dataclass
class Sampling:
    temperature: float
    max_new_tokens: int
    max_context_tokens: int
    max_turns: int = 0  # 0: no limit; otherwise the episode is truncated after this many turns
    context_turns: int = 0  # 0: the context holds the whole episode; otherwise it restarts after this many turns


@dataclass
class _Stream:
    """One agent's side of an episode."""

    episode_id: str
    prompt_key: str
    agent: int
    context: list[int] = field(default_factory=list)
    last_gen: list[int] | None = None  # None until the agent has acted once
    in_context: int = 0  # turns the context holds
    turn: int = 0  # chunks sent on this stream
    last_seq: int = -1  # the link's sequence number of the last chunk sent
    pending_reward: float = 0.0  # rewards given to this agent since its last chunk


class EpisodeRunner:
    def __init__(self, *, actor_id: str, epoch: int, env_factory, chat: ChatTokens, client, link,
                 sampling: Sampling, metrics: ActorMetrics, tasks: TaskSource, frozen_clients: dict | None = None):
        self.actor_id, self.epoch = actor_id, epoch
        self.env_factory, self.chat, self.client, self.link = env_factory, chat, client, link
        self.frozen_clients = frozen_clients or {}  # agent id -> client of the fixed policy it plays
        self.sampling, self.m = sampling, metrics
        self._episode_counter = itertools.count()
        self.tasks = tasks  # what each new episode plays (actors/tasks.py)

    async def run(self, concurrent_episodes: int) -> None:
        """Play until the task source runs out (never, for an unlimited order)."""
        await asyncio.gather(*(self._slot() for _ in range(concurrent_episodes)))

    async def _slot(self) -> None:
        while True:
            waiting_since = time.monotonic()
            granted_by = await self.link.acquire_credit()
            self.m.credit_wait_seconds.inc(time.monotonic() - waiting_since)
            # drawn after the credit, so that consecutive episodes (a group) start together
            assignment = self.tasks.next()
            if assignment is None:
                await self.link.return_credit(granted_by)
                return
            n = next(self._episode_counter)
            streams: dict[int, _Stream] = {}
            self.m.running.inc()
            try:
                outcome = await self.play(f"{self.actor_id}-{self.epoch}-{n}", seed=assignment.seed,
                                          task=assignment.task, streams=streams)
            finally:
                self.m.running.dec()
            # the task source counts a draw as played once the buffer holds its episodes: a draw whose chunks
            # die with this process is played again by the next one (actors/task_position.py)
            await self.link.delivered(max((s.last_seq for s in streams.values()), default=-1))
            self.tasks.played(assignment, [s.prompt_key for s in streams.values()])
            if not any(s.turn for s in streams.values()):  # nothing streamed: the buffer never saw it start
                await self.link.return_credit(granted_by)
            self.m.episodes.labels(outcome).inc()

    async def play(self, episode_id: str, seed: int, task: int | None = None,
                   streams: dict[int, "_Stream"] | None = None) -> str:
        """Play one episode of `task` (None: the seed is the task); `streams` (agent id -> stream) is filled as
        agents act, for the caller to see what was streamed."""
        env: Environment = self.env_factory()
        try:
            return await self._play(env, episode_id, seed, task, {} if streams is None else streams)
        except InferenceError as exc:
            # The buffer expires the partial episode after its timeout and counts it as abandoned.
            self.m.inference_errors.inc()
            log.warning("episode %s abandoned: %s", episode_id, exc)
            return "abandoned"
        except EnvError as exc:
            self.m.env_errors.labels(exc.kind).inc()
            log.warning("episode %s abandoned: environment failed (%s): %s", episode_id, exc.kind, exc)
            return "env_error"
        except Exception:  # an environment bug must not take the actor down
            self.m.env_errors.labels("exception").inc()
            log.exception("episode %s abandoned: environment error", episode_id)
            return "env_error"
        finally:
            try:
                await env.close()
            except Exception as exc:  # closing a dead remote environment must not fail the slot
                log.warning("episode %s: environment close failed: %r", episode_id, exc)

    async def _play(self, env: Environment, episode_id: str, seed: int, task: int | None,
                    streams: dict[int, _Stream]) -> str:
        if hasattr(env, "drive"):  # a user's agent drives its own loop (env.name = "agent", actors/agent_runner.py)
            return await env.drive(self, episode_id, seed, task, streams)
        # an environment that does not enumerate its tasks is never given one (its reset may not take it)
        reset = await (env.reset(seed) if task is None else env.reset(seed, task=task))
        # read after reset: a remote environment learns its action tokens when it is created
        allowed = [self.chat.single_token_id(a) for a in env.action_tokens] if env.action_tokens else []
        max_tokens = min(self.sampling.max_new_tokens, env.max_action_tokens)
        n_agents = max(1, int(env.num_agents))
        agent, observation = reset.agent, reset.observation
        for turn in itertools.count():
            if agent not in range(n_agents):
                raise EnvError(f"environment named agent {agent}, it has {n_agents}", "bad_agent")
            s = streams.get(agent)
            if s is None:
                suffix = f"/a{agent}" if n_agents > 1 else ""
                s = streams[agent] = _Stream(episode_id + suffix, reset.prompt_key + suffix, agent)
            # a restarted context is sampled from the observation alone, as a first turn is
            restart = s.last_gen is not None and 0 < self.sampling.context_turns <= s.in_context
            if s.last_gen is None or restart:
                s.context, s.in_context = [], 0
                obs_tokens = self.chat.first_turn(observation)
            else:
                obs_tokens = self.chat.next_turn(observation, s.last_gen)
            s.context += obs_tokens
            over_budget = self.sampling.max_turns and turn >= self.sampling.max_turns
            if over_budget or len(s.context) + max_tokens > self.sampling.max_context_tokens:
                # Cannot sample this turn; close every stream as truncated with no new tokens.
                await self._send(s, obs_tokens, None, allowed, s.pending_reward, done=True, truncated=True,
                                 t_start=time.time(), context_reset=restart)
                await self._close_others(streams, s, allowed, truncated=True)
                return "truncated"
            t_start = time.time()
            started = time.monotonic()
            client = self.frozen_clients.get(agent, self.client)
            gen = await client.generate(s.context, max_tokens=max_tokens, temperature=self.sampling.temperature,
                                        allowed_token_ids=allowed or None,
                                        cache_salt=f"v{self.link.learner_version}")
            self.m.generate_seconds.observe(time.monotonic() - started)
            (self.m.frozen_tokens if agent in self.frozen_clients else self.m.generated_tokens).inc(len(gen.tokens))
            step = await env.step(self.chat.decode(gen.tokens))
            self.m.turns.inc()
            reward = self._distribute(step, agent, streams) + s.pending_reward
            s.pending_reward = 0.0
            await self._send(s, obs_tokens, gen, allowed, reward, done=step.done, truncated=step.truncated,
                             t_start=t_start, context_reset=restart)
            if step.done:
                await self._close_others(streams, s, allowed, truncated=step.truncated)
                if step.truncated:
                    return "truncated"
                return "success" if (step.info or {}).get("success") else "done"
            s.context += gen.tokens
            s.last_gen = gen.tokens
            s.in_context += 1
            agent = agent if step.agent is None else int(step.agent)
            observation = step.observation
        raise AssertionError("unreachable")

    @staticmethod
    def _distribute(step: Step, acting: int, streams: dict[int, _Stream]) -> float:
        """The acting agent's reward now; other agents' rewards wait for their next (or closing) chunk."""
        if not step.rewards:
            return float(step.reward)
        for agent, r in step.rewards.items():
            if int(agent) != acting and int(agent) in streams:
                streams[int(agent)].pending_reward += float(r)
        return float(step.rewards.get(acting, step.reward))

    async def _close_others(self, streams: dict[int, _Stream], current: _Stream, allowed, *, truncated) -> None:
        for other in streams.values():
            if other is not current and other.turn > 0:
                await self._send(other, [], None, allowed, other.pending_reward, done=True, truncated=truncated,
                                 t_start=time.time())

    async def _send(self, s: _Stream, obs_tokens, gen: Generation | None, allowed, reward, *, done, truncated,
                    t_start, temperature: float | None = None, context_reset: bool = False) -> None:
        """`temperature`: the one the turn was sampled at, when not actor.temperature (an agent's request);
        `context_reset`: `obs_tokens` are the whole context, restarted (Sampling.context_turns)."""
        if s.agent in self.frozen_clients:
            return  # the fixed policy is not trained: its turns stay out of the buffer
        empty_i, empty_f = np.zeros(0, np.int32), np.zeros(0, np.float32)
        chunk = TurnChunk(
            actor_id=self.actor_id, epoch=self.epoch, seq=-1, episode_id=s.episode_id, turn=s.turn,
            prompt_key=s.prompt_key, obs_tokens=np.asarray(obs_tokens, np.int32),
            gen_tokens=np.asarray(gen.tokens, np.int32) if gen else empty_i,
            gen_logprobs=np.asarray(gen.logprobs, np.float32) if gen else empty_f,
            gen_versions=np.asarray(gen.versions, np.int32) if gen else empty_i,
            reward=float(reward), done=done, truncated=truncated, agent_id=s.agent,
            temperature=self.sampling.temperature if temperature is None else temperature,
            allowed_tokens=np.asarray(allowed, np.int32), t_start=t_start, t_end=time.time(),
            context_reset=context_reset,
        )
        s.turn += 1
        await self.link.send(chunk)
        s.last_seq = chunk.seq
