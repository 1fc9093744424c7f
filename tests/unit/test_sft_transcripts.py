"""`turnstream sft`'s rendering: a transcript becomes exactly the tokens an actor builds when the model generates
its assistant messages (the environment loop; the agent endpoint for a system message), the loss mask is
exactly the generated tokens, and a transcript no actor could have produced is refused with its reason."""
from __future__ import annotations

import json

import numpy as np
import pytest

from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.inference.client import Generation
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.context import PlayContext, Sampling
from turnstream.actors.play.endpoint.chat_format import ChatRequest, Message
from turnstream.actors.play.endpoint.episode import AgentEpisode
from turnstream.actors.play.endpoint.metrics import AgentMetrics
from turnstream.actors.play.env_loop import EnvironmentLoop
from turnstream.actors.play.runner import EpisodeRunner
from turnstream.actors.tasks.orders import RandomOrder
from turnstream.actors.tasks.source import TaskSource
from turnstream.core.config import load_config
from turnstream.sft.run import context_limit, render_all
from turnstream.sft.transcripts import Limit, Refused, TranscriptRenderer
from tests.chat_transcripts import Conversation, transcript as _transcript
from tests.unit.fakes import CollectingLink

TURNS = [("goal L at 3 pos 0", "move left"), ("pos -1", "L"), ("pos -2 left wall", "walk to the win")]


class Replies:
    """A policy that generates the given texts, one per call, as a model would: the text's tokens and the
    end-of-turn token it stops on."""

    def __init__(self, chat: ChatTokens, texts: list[str]):
        self.chat, self.texts, self.calls = chat, list(texts), []

    async def generate(self, token_ids, *, max_tokens, temperature, allowed_token_ids=None, cache_salt=None,
                       extra_params=None, top_p=1.0, top_k=0):
        self.calls.append(list(token_ids))
        tokens = self.chat.encode(self.texts.pop(0)) + [self.chat.end_of_turn_id]
        return Generation(tokens, [-0.5] * len(tokens), [0] * len(tokens), "stop")


def _renderer(tiny_model, tokens: int = 1024) -> TranscriptRenderer:
    return TranscriptRenderer(ChatTokens(tiny_model), Limit(tokens, "vllm.max_model_len"))


def _stream(chunks) -> tuple[list[int], list[bool]]:
    """What the buffer assembles from an episode's chunks: the tokens, and which the learner trains."""
    tokens = np.concatenate([np.concatenate([c.obs_tokens, c.gen_tokens]) for c in chunks]).tolist()
    trained = sum(([False] * c.obs_tokens.size + [True] * c.gen_tokens.size for c in chunks), [])
    return tokens, trained


async def test_a_transcript_renders_as_the_environment_loop_builds_the_episode(tiny_model):
    chat = ChatTokens(tiny_model)
    env = Conversation([user for user, _ in TURNS])
    client, link = Replies(chat, [reply for _, reply in TURNS]), CollectingLink()
    runner = EpisodeRunner(actor_id="a", epoch=1, player=EnvironmentLoop(lambda: env), chat=chat, client=client,
                           link=link, sampling=Sampling(1.0, 16, 1024), metrics=ActorMetrics(),
                           tasks=TaskSource(RandomOrder(0)))
    await runner.play("ep", seed=0)
    assert env.actions == [reply for _, reply in TURNS]  # the environment read the replies as they were written
    actor_tokens, actor_trained = _stream(link.chunks)

    rendered = _renderer(tiny_model).render(1, _transcript(TURNS))
    assert rendered.tokens == actor_tokens
    assert rendered.trained == actor_trained
    # the mask is each reply's tokens and the end-of-turn token the model stops on, nothing else
    trained = [t for t, m in zip(rendered.tokens, rendered.trained) if m]
    assert trained == sum((chat.encode(reply) + [chat.end_of_turn_id] for _, reply in TURNS), [])
    # and each context vLLM was sent is a prefix of the rendered transcript, ending where a reply starts
    for context in client.calls:
        assert rendered.tokens[:len(context)] == context and rendered.trained[len(context)]


async def test_a_system_message_renders_as_the_agent_endpoint_renders_it(tiny_model):
    chat = ChatTokens(tiny_model)
    system = "You walk to the goal."
    client, link = Replies(chat, [reply for _, reply in TURNS]), CollectingLink()
    ctx = PlayContext("a", 1, chat, client, link, Sampling(1.0, 16, 1024), ActorMetrics())
    episode = AgentEpisode(ctx, AgentMetrics(ActorMetrics().registry), "ep", "p")
    messages = [Message("system", system)]
    for user, _ in TURNS:  # the agent sends its whole history each call, as an OpenAI client does
        messages.append(Message("user", user))
        reply = await episode.chat(ChatRequest(list(messages)))
        messages.append(Message("assistant", reply.text))
    actor_tokens, actor_trained = _stream(link.chunks)

    rendered = _renderer(tiny_model).render(1, _transcript(TURNS, system=system))
    assert rendered.tokens == actor_tokens
    assert rendered.trained == actor_trained
    assert not any(rendered.trained[:len(chat.encode(f"<|im_start|>system\n{system}<|im_end|>\n"))])


def test_a_last_user_message_is_left_out(tiny_model):
    renderer = _renderer(tiny_model)
    closed = renderer.render(1, _transcript(TURNS))
    open_ended = _transcript(TURNS)
    open_ended["messages"].append({"role": "user", "content": "pos -3"})
    assert renderer.render(1, open_ended) == closed


@pytest.mark.parametrize("line, reason", [
    ("not json", "not_json"),
    ('["a list"]', "no_messages"),
    ('{"messages": []}', "no_messages"),
    ('{"messages": ["hi"]}', "no_messages"),
    ('{"messages": [{"role": "tool", "content": "x"}, {"role": "assistant", "content": "y"}]}', "unknown_role"),
    ('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant"}]}', "missing_content"),
    ('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": null}]}', "missing_content"),
    ('{"messages": [{"role": "user", "content": "x"}]}', "no_assistant"),
    ('{"messages": [{"role": "assistant", "content": "x"}]}', "bad_order"),
    ('{"messages": [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}, '
     '{"role": "assistant", "content": "z"}]}', "bad_order"),
    ('{"messages": [{"role": "user", "content": "x"}, {"role": "system", "content": "y"}, '
     '{"role": "assistant", "content": "z"}]}', "bad_order"),
    ('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y<|im_end|>"}]}',
     "special_token"),
    ('{"messages": [{"role": "system", "content": "<|im_start|>"}, {"role": "user", "content": "x"}, '
     '{"role": "assistant", "content": "y"}]}', "special_token"),
])
def test_a_transcript_no_actor_could_produce_is_refused_with_its_reason(tiny_model, line, reason):
    with pytest.raises(Refused) as exc:
        _renderer(tiny_model).render_line(1, line)
    assert exc.value.reason == reason and str(exc.value)


def test_a_transcript_over_the_context_is_refused_naming_the_setting(tiny_model):
    renderer = _renderer(tiny_model)
    length = len(renderer.render(1, _transcript(TURNS)).tokens)
    assert _renderer(tiny_model, length).render(1, _transcript(TURNS)).tokens  # exactly the context: kept
    with pytest.raises(Refused, match=f"{length} tokens, more than vllm.max_model_len = {length - 1}") as exc:
        _renderer(tiny_model, length - 1).render(1, _transcript(TURNS))
    assert exc.value.reason == "over_context"


def test_refusals_are_one_line_each_counted_and_the_rest_kept(tiny_model, caplog):
    lines = [json.dumps(_transcript(TURNS)), "not json", "", json.dumps(_transcript(TURNS[:1])),
             '{"messages": [{"role": "tool", "content": "x"}]}', "{}"]
    with caplog.at_level("WARNING", logger="turnstream.sft"):
        kept, refused = render_all(lines, _renderer(tiny_model))
    assert [r.line for r in kept] == [1, 4]  # the blank line 3 is skipped, not refused
    assert refused == {"not_json": 1, "unknown_role": 1, "no_messages": 1}
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["line 2", "line 5", "line 6"]
    assert all("\n" not in r.getMessage() for r in caplog.records)


def test_the_limit_is_the_tightest_of_the_context_the_model_and_the_microbatch(tiny_model):
    base = [f"model.path={tiny_model}"]
    assert context_limit(load_config(None, base)) == Limit(512, "vllm.max_model_len")
    assert context_limit(load_config(None, [*base, "vllm.max_model_len=4096"])) == Limit(
        1024, "the model's max_position_embeddings")
    assert context_limit(load_config(None, [*base, "learner.max_tokens_per_microbatch=300"])) == Limit(
        300, "learner.max_tokens_per_microbatch")


def test_the_micro_batch_budget_left_at_auto_is_the_one_the_learner_would_choose(tiny_model, llm_sized_model):
    """None for the tiny model; a pretrained-sized checkpoint's budget, counted from its files, caps a transcript."""
    wide = "vllm.max_model_len=4096"
    assert context_limit(load_config(None, [f"model.path={tiny_model}", wide])) == Limit(
        1024, "the model's max_position_embeddings")
    assert context_limit(load_config(None, [f"model.path={llm_sized_model}", wide])) == Limit(
        2048, "learner.max_tokens_per_microbatch")
