"""The environment loop: the player of an `Environment` (actors/environment.py). It resets the environment,
samples each reply from the policy, steps the environment with its text and streams every turn.

An episode with several agents is streamed as one token stream per agent (episode id `<id>/a<k>`, agent
id on every chunk): each agent has its own conversation, and the buffer assembles each stream as an
episode of its own, so the learner sees exactly the tokens that agent's context held. When the episode
ends, every other agent's stream is closed with a chunk that has no generated tokens and carries that
agent's outstanding reward (e.g. the loser's -1).

Agents share the trained policy unless listed in the context's `frozen_clients`: those are played by a
fixed policy on other servers, and their turns reach the others only as observations; nothing of theirs
is streamed.

When the episode ends, the numbers of the last `Step.info` it got are left on the `Episode` as its figures
(play/episode_figures.py), beside the outcome `play` returns.

Every episode's environment is played through the guard (actors/envs/guard/): each call has a time limit, the
stretches it holds the actor's event loop are measured, and with env.isolation = "process" it runs in a worker
process (its host).
"""
from __future__ import annotations

import itertools
import time
from typing import Callable

from turnstream.actors.environment import EnvError, Environment, Step
from turnstream.actors.envs.guard.guarded import GuardedEnvironment
from turnstream.actors.envs.guard.hosts import EnvHost, LoopHost
from turnstream.actors.envs.guard.settings import GuardSettings
from turnstream.actors.envs.guard.timed import LoopBlockMeter
from turnstream.actors.envs.guard.watchdog import LoopWatchdog
from turnstream.actors.play.context import PlayContext
from turnstream.actors.play.episode_figures import EpisodeFigures
from turnstream.actors.play.player import Episode, EpisodePlayer, abandon_on_failure
from turnstream.actors.play.stream import Stream


class EnvironmentLoop(EpisodePlayer):
    """Plays each episode on a fresh environment from `host` (default: `make_env` on the actor's loop), under
    `guard`'s limits, and `watchdog` (default: the actor exits on a stall, watchdog.py) watching the calls on the
    loop. The start-up environment is always made by `make_env`, in the actor's process: it is only asked
    questions (num_tasks), never reset or stepped."""

    def __init__(self, make_env: Callable[[], Environment], guard: GuardSettings = GuardSettings(),
                 host: EnvHost | None = None, watchdog: LoopWatchdog | None = None):
        self.make_env, self.guard = make_env, guard
        self.host = host or LoopHost(make_env)
        self.meter = LoopBlockMeter(guard.loop_block_warn_s, watchdog)
        self._startup_env: Environment | None = None

    def guarded_by(self, guard: GuardSettings) -> str:
        """Its guard is the one it was made with (its host follows from it); this says where it runs."""
        g = self.guard
        limits = f"reset {g.reset_timeout_s:g}s, step {g.step_timeout_s:g}s, close {g.close_timeout_s:g}s"
        if g.isolation == "process":
            return (f'environments run in {g.worker_count()} worker processes (env.isolation = "process"); time '
                    f"limits {limits}")
        return (f'environments run on the actor\'s event loop (env.isolation = "loop"); time limits {limits}, held by '
                "the loop watchdog too")

    def startup_env(self) -> Environment:
        if self._startup_env is None:  # made on first ask only: building an environment can load a dataset
            self._startup_env = self.make_env()
        return self._startup_env

    async def play(self, ctx: PlayContext, episode: Episode) -> str:
        env = GuardedEnvironment(self.host, self.guard, self.meter, ctx.metrics)
        try:
            return await abandon_on_failure(ctx, episode.episode_id, _play(ctx, env, episode))
        finally:
            async with ctx.waiting_on_env():
                await env.close()  # never raises: a failed close is logged and counted


async def _play(ctx: PlayContext, env: Environment, episode: Episode) -> str:
    sampling, chat, streams = ctx.sampling, ctx.chat, episode.streams
    # an environment that does not enumerate its tasks is never given one (its reset may not take it)
    # inside an environment call the episode wants no generation: another may start meanwhile (play/in_flight.py)
    async with ctx.waiting_on_env():
        reset = await (env.reset(episode.seed) if episode.task is None else env.reset(episode.seed, task=episode.task))
    # read after reset: a remote environment learns its action tokens when it is created
    allowed = [chat.single_token_id(a) for a in env.action_tokens] if env.action_tokens else []
    max_tokens = min(sampling.max_new_tokens, env.max_action_tokens)
    n_agents = max(1, int(env.num_agents))
    agent, observation = reset.agent, reset.observation
    last_info: dict | None = None  # of the last step: a truncated episode's figures
    for turn in itertools.count():
        if agent not in range(n_agents):
            raise EnvError(f"environment named agent {agent}, it has {n_agents}", "bad_agent")
        s = streams.get(agent)
        if s is None:
            suffix = f"/a{agent}" if n_agents > 1 else ""
            s = streams[agent] = Stream(episode.episode_id + suffix, reset.prompt_key + suffix, agent)
        # a restarted context is sampled from the observation alone, as a first turn is
        restart = s.last_gen is not None and 0 < sampling.context_turns <= s.in_context
        if s.last_gen is None or restart:
            s.context, s.in_context = [], 0
            obs_tokens = chat.first_turn(observation, reset.system)
        else:
            obs_tokens = chat.next_turn(observation, s.last_gen)
        s.context += obs_tokens
        over_budget = sampling.max_turns and turn >= sampling.max_turns
        if over_budget or len(s.context) + max_tokens > sampling.max_context_tokens:
            # Cannot sample this turn; close every stream as truncated with no new tokens.
            await ctx.send(s, obs_tokens, None, allowed, s.pending_reward, done=True, truncated=True,
                           t_start=time.time(), context_reset=restart)
            await _close_others(ctx, streams, s, allowed, truncated=True)
            episode.figures = EpisodeFigures.from_info(last_info)
            return "truncated"
        t_start = time.time()
        started = time.monotonic()
        client = ctx.frozen_clients.get(agent, ctx.client)
        gen = await client.generate(s.context, max_tokens=max_tokens, temperature=sampling.temperature,
                                    allowed_token_ids=allowed or None, cache_salt=f"v{ctx.link.learner_version}",
                                    top_p=sampling.top_p, top_k=sampling.top_k)
        ctx.metrics.generate_seconds.observe(time.monotonic() - started)
        (ctx.metrics.frozen_tokens if agent in ctx.frozen_clients else ctx.metrics.generated_tokens).inc(
            len(gen.tokens))
        async with ctx.waiting_on_env():
            step = await env.step(chat.decode(gen.tokens))
        ctx.metrics.turns.inc()
        reward = _distribute(step, agent, streams) + s.pending_reward
        s.pending_reward = 0.0
        await ctx.send(s, obs_tokens, gen, allowed, reward, done=step.done, truncated=step.truncated,
                       t_start=t_start, context_reset=restart)
        if step.done:
            await _close_others(ctx, streams, s, allowed, truncated=step.truncated)
            episode.figures = EpisodeFigures.from_info(step.info)
            if step.truncated:
                return "truncated"
            return "success" if (step.info or {}).get("success") else "done"
        s.context += gen.tokens
        s.last_gen = gen.tokens
        s.in_context += 1
        agent = agent if step.agent is None else int(step.agent)
        observation = step.observation
        last_info = step.info
    raise AssertionError("unreachable")


def _distribute(step: Step, acting: int, streams: dict[int, Stream]) -> float:
    """The acting agent's reward now; other agents' rewards wait for their next (or closing) chunk."""
    if not step.rewards:
        return float(step.reward)
    for agent, r in step.rewards.items():
        if int(agent) != acting and int(agent) in streams:
            streams[int(agent)].pending_reward += float(r)
    return float(step.rewards.get(acting, step.reward))


async def _close_others(ctx: PlayContext, streams: dict[int, Stream], current: Stream, allowed, *,
                        truncated) -> None:
    for other in streams.values():
        if other is not current and other.turn > 0:
            await ctx.send(other, [], None, allowed, other.pending_reward, done=True, truncated=truncated,
                           t_start=time.time())
