"""The OpenAI-compatible endpoint and the agent runner with the real `openai` client over real HTTP on the
loopback, generation by a scripted client (tests/e2e/test_agent_endpoint.py does it against real vLLM):
each call is one streamed turn that appends only the new messages' tokens, a history that does not
continue the recorded one is a counted new segment, bad requests are 400s with a counted reason, and a
failing agent is abandoned with a counted reason while the actor goes on."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from prometheus_client import generate_latest

from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.play.agent import AgentPlayer
from turnstream.actors.play.context import Sampling
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.endpoint.chat_format import (BadRequest, Message, parse_request, parse_tool_calls, render,
                                           tool_call_constraint)
from turnstream.actors.envs.registry import make_env
from turnstream.actors.tasks.orders import RandomOrder
from turnstream.actors.tasks.source import TaskSource
from turnstream.actors.play.runner import EpisodeRunner
from turnstream.core.config import ConfigError
from turnstream.reference.metrics import lint_exposition
from tests.unit.fakes import CollectingLink, ScriptedClient

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


def runner_for(tiny_model, solve=None, *, tasks=None, client=None, max_context: int = 512):
    """(runner, link, env) of an agent environment playing `solve` (set env.solve to change it)."""
    env = AgentPlayer(entry="tests.unit.test_openai_endpoint:two_turns", tasks=tasks, timeout_s=30)
    env.solve = solve or two_turns
    link = CollectingLink()
    chat = ChatTokens(tiny_model)
    runner = EpisodeRunner(actor_id="t", epoch=1, player=env, chat=chat,
                           client=client or ScriptedClient(free_tokens=chat.encode("hello there")), link=link,
                           sampling=Sampling(1.0, 8, max_context), metrics=ActorMetrics(),
                           tasks=TaskSource(RandomOrder(0)))
    return runner, link, env


def sample(runner, name, labels=None):
    return runner.context.metrics.registry.get_sample_value(name, labels or {}) or 0.0


# ---- the chat format ------------------------------------------------------------------------------------

def test_messages_render_as_chatml_with_hermes_tools():
    msgs = [Message("system", "be brief"), Message("user", "2+3?"),
            Message("assistant", "", (("add", '{"a": 2, "b": 3}'),)), Message("tool", "5")]
    tools = [{"name": "add", "parameters": {"type": "object"}}]
    assert render(msgs, tools, first=True) == (
        '<|im_start|>system\nbe brief\n\n<tools>\n{"name": "add", "parameters": {"type": "object"}}\n</tools>'
        '<|im_end|>\n<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n\n<tool_call>\n'
        '{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n')
    assert render(msgs[1:2], tools, first=True).startswith("<|im_start|>system\n<tools>\n")


def test_tool_calls_are_parsed_from_generated_text():
    text = 'let me add <tool_call>\n{"name": "add", "arguments": {"b": 3, "a": 2}}\n</tool_call>'
    assert parse_tool_calls(text) == ("let me add", [("add", '{"a": 2, "b": 3}')])
    broken = "<tool_call>{not json}</tool_call>"
    assert parse_tool_calls(broken) == (broken, [])  # stays text: the model's mistake, not a call
    constraint = json.loads(tool_call_constraint({"name": "add", "parameters": {"type": "object"}})["structural_tag"])
    assert constraint["format"]["begin"] == "<tool_call>\n"


@pytest.mark.parametrize("body, reason", [
    ([], "bad_json"), ({}, "no_messages"), ({"messages": [{"role": "robot", "content": "x"}]}, "bad_message"),
    ({"messages": [{"role": "user", "content": 3}]}, "bad_content"),
    ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "bad_stream"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "bad_n"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "bad_temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "bad_max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "bad_tools"),
    ({"messages": [{"role": "user", "content": "x"}], "stop": [3]}, "bad_stop"),
])
def test_malformed_requests_name_their_reason(body, reason):
    with pytest.raises(BadRequest) as exc:
        parse_request(body)
    assert exc.value.reason == reason


# ---- episodes through the endpoint, with the real openai client -------------------------------------------

async def two_turns(client, task):
    messages = [{"role": "user", "content": f"task {task}"}]
    first = await client.chat.completions.create(model="m", messages=messages)
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "again"}]
    await client.chat.completions.create(model="m", messages=messages)
    return 1.0


async def test_each_call_is_one_turn_that_appends_only_the_new_messages(tiny_model):
    runner, link, _ = runner_for(tiny_model, two_turns)
    streams = {}
    assert await runner.play("ep", seed=7, streams=streams) == "success"
    chat, calls = runner.context.chat, runner.context.client.calls
    first, second, closing = link.chunks
    assert first.obs_tokens.tolist() == chat.encode("<|im_start|>user\ntask 7<|im_end|>\n<|im_start|>assistant\n")
    assert calls[0] == first.obs_tokens.tolist()
    # the second context is the first context, the generated ids as returned, then only the new user message
    assert calls[1] == calls[0] + first.gen_tokens.tolist() + second.obs_tokens.tolist()
    assert chat.decode(second.obs_tokens.tolist()) == "\nuser\nagain\nassistant\n"  # specials decode away
    assert second.obs_tokens.tolist()[0] == chat.end_of_turn_id  # the reply is closed: it ran out of tokens
    assert (closing.done, closing.reward, closing.gen_tokens.size) == (True, 1.0, 0)
    assert [c.episode_id for c in link.chunks] == ["ep"] * 3 and streams[0].turn == 3
    assert sample(runner, "turnstream_actor_openai_requests_total", {"status": "200"}) == 2


async def edited_history(client, task):
    first = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
    history = [{"role": "user", "content": "a (edited)"}, first.choices[0].message.model_dump(exclude_none=True)]
    await client.chat.completions.create(model="m", messages=history + [{"role": "user", "content": "b"}])
    return 0.5


async def test_a_history_that_does_not_continue_the_tokens_restarts_the_context_counted(tiny_model):
    runner, link, _ = runner_for(tiny_model, edited_history, tasks=["x"])
    assert await runner.play("ep", seed=0, task=0) == "done"  # 0.5 < success_at
    first, second, closing = link.chunks
    assert {c.episode_id for c in link.chunks} == {"ep"} and {c.prompt_key for c in link.chunks} == {"task-0"}
    # one episode: the second turn's context is the edited conversation rendered afresh, not the first turn's
    assert (first.context_reset, second.context_reset) == (False, True)
    assert second.obs_tokens.tolist()[:3] == runner.context.chat.encode("<|im_start|>user\na (edited)")[:3]
    assert runner.context.client.calls[1] == second.obs_tokens.tolist()
    assert closing.done and closing.reward == 0.5 and [c.turn for c in link.chunks] == [0, 1, 2]
    assert sample(runner, "turnstream_actor_agent_segments_total") == 1


async def raises(client, task):
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    raise KeyError("the user's bug")


async def test_a_failing_agent_is_abandoned_and_counted_and_the_actor_goes_on(tiny_model):
    runner, link, env = runner_for(tiny_model)
    for solve in (raises, lambda client, task: asyncio.sleep(0, "not a number")):
        env.solve = solve
        assert await runner.play("ep", seed=0) == "agent_error"
    assert sample(runner, "turnstream_actor_agent_errors_total", {"reason": "KeyError"}) == 1
    assert sample(runner, "turnstream_actor_agent_errors_total", {"reason": "TypeError"}) == 1
    assert not any(c.done for c in link.chunks)  # left open: the buffer drops it as abandoned
    env.solve = two_turns
    assert await runner.play("next", seed=1) == "success"


async def test_bad_requests_get_openai_errors_and_counters_and_the_server_keeps_serving(tiny_model):
    runner, _, env = runner_for(tiny_model)
    answers = {}

    async def probe(client, task):
        base = str(client.base_url).rstrip("/")
        async with aiohttp.ClientSession() as http:
            for name, url, data in [
                    ("garbage", f"{base}/chat/completions", b"\x00\xff not json"),
                    ("no_messages", f"{base}/chat/completions", b"{}"),
                    ("unknown", base.replace("/episodes/", "/episodes/nope-") + "/chat/completions", b"{}"),
                    ("reward", base.rsplit("/v1", 1)[0] + "/reward", b'{"reward": "lots"}')]:
                async with http.post(url, data=data, headers={"content-type": "application/json"}) as resp:
                    answers[name] = (resp.status, (await resp.json())["error"]["code"])
            async with http.post(base.rsplit("/v1", 1)[0] + "/reward", json={"reward": 0.25}) as resp:
                assert resp.status == 200
        return await two_turns(client, task)

    env.solve = probe
    assert await runner.play("ep", seed=0) == "success"
    assert answers == {"garbage": (400, "bad_json"), "no_messages": (400, "no_messages"),
                       "unknown": (404, "unknown_episode"), "reward": (400, "bad_reward")}
    for reason in ("bad_json", "no_messages", "unknown_episode", "bad_reward"):
        assert sample(runner, "turnstream_actor_openai_bad_requests_total", {"reason": reason}) == 1
    # the endpoint's metrics are in the actor's catalogue (docs/metrics.md) and follow its naming rules
    assert lint_exposition(generate_latest(runner.context.metrics.registry).decode(), role="actor") == {}


async def test_a_call_past_the_context_truncates_the_episode(tiny_model):
    runner, link, _ = runner_for(tiny_model, two_turns, max_context=40)
    assert await runner.play("ep", seed=0) == "truncated"
    assert link.chunks[-1].done and link.chunks[-1].truncated


async def test_tool_calls_reach_the_caller_in_the_openai_shape_unless_tool_choice_is_none(tiny_model):
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    chat = ChatTokens(tiny_model)
    runner, link, env = runner_for(tiny_model,
                                   client=ScriptedClient(free_tokens=chat.encode(text) + [chat.end_of_turn_id]))
    runner.context.sampling.max_new_tokens = 64
    seen = []

    async def calls_add(client, task):
        messages = [{"role": "user", "content": "2+3?"}]
        for choice in ("auto", "none"):
            reply = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS,
                                                         tool_choice=choice, max_tokens=64)
            seen.append(reply.choices[0])
        return 1.0

    env.solve = calls_add
    assert await runner.play("ep", seed=0) == "success"
    auto, none = seen
    assert auto.finish_reason == "tool_calls" and auto.message.content is None
    [call] = auto.message.tool_calls
    assert (call.type, call.function.name, json.loads(call.function.arguments)) == ("function", "add",
                                                                                    {"a": 2, "b": 3})
    # (the scripted client reports every generation as cut at max_tokens)
    assert none.finish_reason == "length" and not none.message.tool_calls and none.message.content == text


async def test_a_streamed_call_is_one_turn_answered_as_server_sent_chunks(tiny_model):
    runner, link, env = runner_for(tiny_model)
    got = {}

    async def streams(client, task):
        messages = [{"role": "user", "content": "hi"}]
        events = await client.chat.completions.create(model="m", messages=messages, stream=True,
                                                      stream_options={"include_usage": True})
        chunks = [e async for e in events]
        got["text"] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        got["finish"] = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        got["usage"] = chunks[-1].usage.completion_tokens
        messages += [{"role": "assistant", "content": got["text"]}, {"role": "user", "content": "and?"}]
        await client.chat.completions.create(model="m", messages=messages)  # continues the same stream
        return 1.0

    env.solve = streams
    assert await runner.play("ep", seed=0) == "success"
    first = link.chunks[0]
    assert got == {"text": runner.context.chat.decode(first.gen_tokens.tolist()), "finish": "length",
                   "usage": first.gen_tokens.size}
    assert [c.episode_id for c in link.chunks] == ["ep"] * 3  # no new segment: the history matched


def test_the_agent_env_is_configured_by_entry_and_tasks():
    env = make_env("agent", entry="tests.unit.test_openai_endpoint:two_turns", tasks=["a", "b"])
    assert env.num_tasks == 2 and env.solve.__name__ == "two_turns"
    named = make_env("agent", entry="tests.unit.test_openai_endpoint:two_turns",
                     tasks="tests.unit.test_openai_endpoint:TOOLS")  # a list named like the entry
    assert named.tasks == TOOLS
    with pytest.raises(ConfigError, match="^env.args.entry: cannot load"):
        make_env("agent", entry="tests.unit.test_openai_endpoint:missing")
    with pytest.raises(ConfigError, match="must be an async function"):
        make_env("agent", entry="json:dumps")
