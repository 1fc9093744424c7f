"""What every episode player works with: the chat tokens, the inference clients, the sampling settings, the
link to the buffer and the metrics, and `send`, which turns one turn of a stream into a `TurnChunk`.

One context serves every episode of an actor; the evaluation rounds play with a copy whose link drops
every chunk (actors/evaluation.py).
"""
from __future__ import annotations

import time
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field

import numpy as np

from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.inference.client import Generation
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.endpoint.address import EndpointAddress
from turnstream.actors.play.in_flight import waiting_on_env
from turnstream.actors.play.stream import Stream
from turnstream.core.config import Config
from turnstream.protocol.messages import TurnChunk


@dataclass
class Sampling:
    temperature: float
    max_new_tokens: int
    max_context_tokens: int
    max_turns: int = 0  # 0: no limit; otherwise the episode is truncated after this many turns
    context_turns: int = 0  # 0: the context holds the whole episode; otherwise it restarts after this many turns
    top_p: float = 1.0  # 1: no nucleus truncation
    top_k: int = 0  # 0: no top-k truncation

    @classmethod
    def from_config(cls, cfg: Config) -> Sampling:
        """The run's sampling settings ([actor], and the context vLLM holds)."""
        a = cfg.actor
        return cls(a.temperature, a.max_new_tokens, cfg.vllm.max_model_len, a.max_turns, a.context_turns, a.top_p,
                   a.top_k)


@dataclass
class PlayContext:
    """`client`: the trained policy's inference fleet; `frozen_clients`: agent id -> the client of the fixed
    policy that agent plays (its turns are never streamed); `link`: where chunks go (actors/link.py), and the
    learner version the actor knows; `request_timeout_s`: the clients' time limit for one call; `endpoint`: where
    the OpenAI-compatible endpoint of agent episodes listens (play/endpoint/)."""

    actor_id: str
    epoch: int
    chat: ChatTokens
    client: object
    link: object
    sampling: Sampling
    metrics: ActorMetrics
    frozen_clients: dict = field(default_factory=dict)
    request_timeout_s: float = 60.0
    endpoint: EndpointAddress = EndpointAddress()

    def waiting_on_env(self) -> AbstractAsyncContextManager[None]:
        """Wrap each environment call in this: the episode wants no generation meanwhile, so the runner may start
        another in its place (play/in_flight.py)."""
        return waiting_on_env()

    async def send(self, s: Stream, obs_tokens, gen: Generation | None, allowed, reward, *, done, truncated,
                   t_start, temperature: float | None = None, context_reset: bool = False) -> None:
        """`temperature`: the one the turn was sampled at, when not actor.temperature (an agent's request);
        `context_reset`: `obs_tokens` are the whole context, restarted (Sampling.context_turns). The turn's top-p
        and top-k are `gen`'s, those its request gave vLLM, whoever made the request."""
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
            context_reset=context_reset, top_p=gen.top_p if gen else 1.0, top_k=gen.top_k if gen else 0,
            seed=gen.seed if gen else -1,
        )
        s.turn += 1
        await self.link.send(chunk)
        s.last_seq = chunk.seq
