"""Plays episodes: K concurrent loops, each waits for a credit, plays one episode, streams each turn."""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass

import numpy as np

from actors.chat import ChatTokens
from actors.env import Environment
from actors.inference import InferenceError, VllmClient
from actors.link import BufferLink
from actors.metrics import ActorMetrics
from protocol.messages import TurnChunk

log = logging.getLogger("turnstream.actor")


@dataclass
class Sampling:
    temperature: float
    max_new_tokens: int
    max_context_tokens: int


class EpisodeRunner:
    def __init__(self, *, actor_id: str, epoch: int, env_factory, chat: ChatTokens, client: VllmClient,
                 link: BufferLink, sampling: Sampling, metrics: ActorMetrics, seed: int):
        self.actor_id, self.epoch = actor_id, epoch
        self.env_factory, self.chat, self.client, self.link = env_factory, chat, client, link
        self.sampling, self.m = sampling, metrics
        self._episode_counter = itertools.count()
        self.seed = seed

    async def run(self, concurrent_episodes: int) -> None:
        await asyncio.gather(*(self._slot() for _ in range(concurrent_episodes)))

    async def _slot(self) -> None:
        while True:
            await self.link.acquire_credit()
            n = next(self._episode_counter)
            self.m.running.inc()
            try:
                outcome = await self.play(f"{self.actor_id}-{self.epoch}-{n}", seed=self.seed * 1_000_003 + n)
            finally:
                self.m.running.dec()
            self.m.episodes.labels(outcome).inc()

    async def play(self, episode_id: str, seed: int) -> str:
        env: Environment = self.env_factory()
        allowed = [self.chat.single_token_id(a) for a in env.action_tokens] if env.action_tokens else []
        max_tokens = min(self.sampling.max_new_tokens, env.max_action_tokens)
        try:
            reset = await env.reset(seed)
            obs_tokens = self.chat.first_turn(reset.observation)
            context: list[int] = []
            for turn in itertools.count():
                context += obs_tokens
                if len(context) + max_tokens > self.sampling.max_context_tokens:
                    # Cannot sample this turn; close the episode as truncated with no new tokens.
                    await self._send(episode_id, turn, reset.prompt_key, obs_tokens, None, allowed, 0.0,
                                     done=True, truncated=True, t_start=time.time())
                    return "truncated"
                t_start = time.time()
                started = time.monotonic()
                gen = await self.client.generate(context, max_tokens=max_tokens,
                                                 temperature=self.sampling.temperature,
                                                 allowed_token_ids=allowed or None,
                                                 cache_salt=f"v{self.link.learner_version}")
                self.m.generate_seconds.observe(time.monotonic() - started)
                self.m.generated_tokens.inc(len(gen.tokens))
                step = await env.step(self.chat.decode(gen.tokens))
                self.m.turns.inc()
                await self._send(episode_id, turn, reset.prompt_key, obs_tokens, gen, allowed, step.reward,
                                 done=step.done, truncated=step.truncated, t_start=t_start)
                if step.done:
                    return "success" if (step.info or {}).get("success") else "done"
                context += gen.tokens
                obs_tokens = self.chat.next_turn(step.observation, gen.tokens)
        except InferenceError as exc:
            # The buffer expires the partial episode after its timeout and counts it as abandoned.
            self.m.inference_errors.inc()
            log.warning("episode %s abandoned: %s", episode_id, exc)
            return "abandoned"
        except Exception:  # an environment bug must not take the actor down
            log.exception("episode %s abandoned: environment error", episode_id)
            return "env_error"
        finally:
            await env.close()

    async def _send(self, episode_id, turn, prompt_key, obs_tokens, gen, allowed, reward, *, done, truncated,
                    t_start) -> None:
        empty_i, empty_f = np.zeros(0, np.int32), np.zeros(0, np.float32)
        chunk = TurnChunk(
            actor_id=self.actor_id, epoch=self.epoch, seq=-1, episode_id=episode_id, turn=turn,
            prompt_key=prompt_key, obs_tokens=np.asarray(obs_tokens, np.int32),
            gen_tokens=np.asarray(gen.tokens, np.int32) if gen else empty_i,
            gen_logprobs=np.asarray(gen.logprobs, np.float32) if gen else empty_f,
            gen_versions=np.asarray(gen.versions, np.int32) if gen else empty_i,
            reward=float(reward), done=done, truncated=truncated, temperature=self.sampling.temperature,
            allowed_tokens=np.asarray(allowed, np.int32), t_start=t_start, t_end=time.time(),
        )
        await self.link.send(chunk)
