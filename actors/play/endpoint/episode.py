"""One episode driven by a user's agent through the OpenAI-compatible endpoint: each chat call is one turn.

The episode keeps the exact token ids its context holds: the first call renders its messages, every later
call appends only the text of the messages that came after the ones already seen (the assistant replies
included, which are the generated tokens themselves), so nothing generated is re-tokenised. The turn goes
to the buffer at once, like any turn of the environment loop (its chunk carries the rewards reported since
the last one).

A caller whose history does not continue the recorded one (it edited, dropped or reordered messages, or
changed the tools, as an agent that summarises or trims its history does) starts a new segment: the turn's
context restarts from the whole conversation rendered afresh (`TurnChunk.context_reset`), counted in
`turnstream_actor_agent_segments_total`. It stays one episode: the learner reads each turn in the context it
was sampled from, and turn-level GAE runs on across the restart to the episode's final reward.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from turnstream.actors.play.context import PlayContext
from turnstream.actors.play.endpoint.chat_format import (BadRequest, ChatRequest, Message, forced_tool,
                                                         parse_tool_calls, render, tool_call_constraint)
from turnstream.actors.play.endpoint.metrics import AgentMetrics
from turnstream.actors.play.stream import Stream

ASSISTANT = "<|im_start|>assistant\n"  # the generation prompt that opens every turn's reply


class EpisodeOver(Exception):
    """The episode ended (truncated, or finished by the reward route); the call cannot be a turn of it."""


@dataclass
class Reply:
    text: str
    tool_calls: list[tuple[str, str]]  # (name, arguments JSON)
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


@dataclass
class AgentEpisode:
    ctx: PlayContext
    metrics: AgentMetrics
    episode_id: str
    prompt_key: str
    stream: Stream | None = None  # None until the first call
    history: list[Message] = field(default_factory=list)  # what the current context renders
    tools: list[dict] = field(default_factory=list)
    turns: int = 0
    pending_reward: float = 0.0
    outcome: str | None = None  # set once the episode is over: truncated, done
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one turn at a time: a turn extends the last
    # the agent's own work between its calls, held to the time limits (session.py): calls in progress, when the
    # last one returned (or the episode began), and set while none is in progress
    calls_open: int = 0
    agent_since: float = field(default_factory=time.monotonic)
    no_call: asyncio.Event = field(default_factory=asyncio.Event)

    async def chat(self, request: ChatRequest) -> Reply:
        self.calls_open += 1
        self.no_call.clear()
        try:
            async with self.lock:
                if self.outcome is not None:
                    raise EpisodeOver(f"episode {self.episode_id} is over ({self.outcome})")
                return await self._turn(request)
        finally:
            self.calls_open -= 1
            if not self.calls_open:
                self.agent_since = time.monotonic()
                self.no_call.set()

    def _new_messages(self, request: ChatRequest) -> list[Message] | None:
        """The messages after the recorded history; None when the caller's history does not continue it."""
        n = len(self.history)
        if self.stream is None or request.tools != self.tools or request.messages[:n] != self.history:
            return None
        return request.messages[n:]

    def _observation(self, request: ChatRequest) -> tuple[list[int], list[int], bool]:
        """(the context before this turn, the turn's observation tokens, whether the context restarts)."""
        chat, new = self.ctx.chat, self._new_messages(request)
        if new is None:  # the first call, or a history that does not continue the recorded one: a new context
            return [], chat.encode(render(request.messages, request.tools, first=True) + ASSISTANT), True
        s = self.stream
        closing = "" if s.last_gen and s.last_gen[-1] == chat.end_of_turn_id else chat.end_of_turn
        return s.context, chat.encode(f"{closing}\n" + render(new, request.tools, first=False) + ASSISTANT), False

    async def _turn(self, request: ChatRequest) -> Reply:
        ctx, sampling = self.ctx, self.ctx.sampling
        temperature = sampling.temperature if request.temperature is None else request.temperature
        if temperature <= 0:
            raise BadRequest("bad_temperature", "temperature must be > 0: greedy sampling has no log-probs to train on")
        extra: dict = {"stop": request.stop} if request.stop else {}
        if (tool := forced_tool(request)) is not None:
            extra["structured_outputs"] = tool_call_constraint(tool)
        before, obs_tokens, restart = self._observation(request)
        context = before + obs_tokens
        max_tokens = min(request.max_tokens or sampling.max_new_tokens, sampling.max_new_tokens)
        if (sampling.max_turns and self.turns >= sampling.max_turns) or \
                len(context) + max_tokens > sampling.max_context_tokens:
            await self._close(truncated=True)
            # worded as OpenAI words it: clients (verifiers, LiteLLM) recognise an overlong prompt by it
            raise BadRequest("context_length_exceeded", f"This model's maximum context length is "
                             f"{sampling.max_context_tokens} tokens: the episode's context ({len(context)} tokens) "
                             f"and max_tokens ({max_tokens}) exceed it, or actor.max_turns turns were played; the "
                             "episode is truncated")
        if request.min_tokens:
            extra["min_tokens"] = min(request.min_tokens, max_tokens)
        t_start, started = time.time(), time.monotonic()
        # generated first, recorded after: a failed call leaves the episode as it was, for the caller to retry
        gen = await ctx.client.generate(context, max_tokens=max_tokens, temperature=temperature,
                                        cache_salt=f"v{ctx.link.learner_version}",
                                        **({"extra_params": extra} if extra else {}))
        ctx.metrics.generate_seconds.observe(time.monotonic() - started)
        ctx.metrics.generated_tokens.inc(len(gen.tokens))
        ctx.metrics.turns.inc()
        new_context = restart and self.stream is not None  # the first call's context is new too, not restarted
        if self.stream is None:
            self.stream = Stream(self.episode_id, self.prompt_key, 0)
        if new_context:
            self.metrics.segments.inc()
        s = self.stream
        self.turns += 1
        text = ctx.chat.decode(gen.tokens)
        for stop in request.stop:  # OpenAI's replies end before the stop string; the tokens keep all of it
            text = text.split(stop, 1)[0]
        # tool_choice = none: whatever the model wrote is its answer, even text shaped like a call
        content, calls = (text, []) if request.tool_choice == "none" else parse_tool_calls(text)
        reward, self.pending_reward = self.pending_reward, 0.0
        await ctx.send(s, obs_tokens, gen, [], reward, done=False, truncated=False, t_start=t_start,
                       temperature=temperature, context_reset=new_context)
        s.context = context + gen.tokens
        s.last_gen = gen.tokens
        self.tools, self.history = request.tools, [*request.messages, Message("assistant", content, tuple(calls))]
        finish = "tool_calls" if calls else ("length" if gen.finish_reason == "length" else "stop")
        return Reply(content, calls, finish, len(context), len(gen.tokens))

    def add_reward(self, reward: float) -> None:
        self.pending_reward += reward

    async def finish(self, reward: float = 0.0) -> str:
        """Close the episode's stream (if a turn was streamed) with its reward; the outcome."""
        async with self.lock:
            if self.outcome is None:
                self.pending_reward += reward
                await self._close(truncated=False)
            return self.outcome

    async def _close(self, *, truncated: bool) -> None:
        self.outcome = "truncated" if truncated else "done"
        if self.stream is not None and self.stream.turn:
            await self.ctx.send(self.stream, [], None, [], self.pending_reward, done=True, truncated=truncated,
                                t_start=time.time())
        self.pending_reward = 0.0
