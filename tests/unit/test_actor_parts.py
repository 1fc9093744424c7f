"""Environments, chat token deltas and vLLM response parsing."""
from __future__ import annotations

import asyncio

import pytest

from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.envs.registry import known_envs, make_env
from turnstream.actors.inference.client import InferenceError, parse_generation, parse_version


def _play(env, policy, seed):
    async def run():
        reset = await env.reset(seed)
        obs, total, turns = reset.observation, 0.0, 0
        while True:
            step = await env.step(policy(obs))
            total, turns = total + step.reward, turns + 1
            if step.done:
                return total, turns, reset.prompt_key
            assert step.reward == 0.0, "reward must come only at the end"
            obs = step.observation

    return asyncio.run(run())


def test_follow_signs_rewards_only_reading_the_signs():
    env = make_env("follow_signs")
    follow = lambda obs: obs.split()[-1]  # noqa: E731
    results = [_play(env, follow, seed) for seed in range(200)]
    assert all(r == 1.0 for r, _, _ in results)
    assert {t for _, t, _ in results} == {2, 3, 4}
    # any observation-blind policy succeeds with probability 2^-k; "always R" is one of them
    blind = [_play(env, lambda obs: "R", seed) for seed in range(4000)]
    for k in (2, 3, 4):
        rate = sum(r for r, t, _ in blind if t == k) / sum(1 for _, t, _ in blind if t == k)
        assert abs(rate - 2.0 ** -k) < 0.05


def test_envs_registered_and_bad_args_rejected():
    assert {"follow_signs", "goal_walk"} <= set(known_envs())
    with pytest.raises(KeyError):
        make_env("nope")
    with pytest.raises(TypeError):
        make_env("follow_signs", bogus=1)


def test_chat_deltas_append_without_retokenising(tiny_model):
    chat = ChatTokens(tiny_model)
    first = chat.first_turn("junction 1 sign L")
    action = [chat.single_token_id("L")]
    delta = chat.next_turn("junction 2 sign R", action)
    # the context is a concatenation; the model's own token is kept as sampled
    context = first + action + delta
    assert context[: len(first)] == first and context[len(first)] == action[0]
    assert chat.decode(delta).strip().startswith("user")
    assert delta[0] == chat.end_of_turn_id  # the reply is closed before the next user turn
    # if the model closed its turn itself, the delta does not close it again
    assert chat.next_turn("x", [chat.end_of_turn_id])[0] != chat.end_of_turn_id
    with pytest.raises(ValueError):
        chat.single_token_id("junction junction")


def _response(tokens, logprobs, spans):
    return {"choices": [{"token_ids": tokens, "finish_reason": "length", "weight_versions": spans,
                         "logprobs": {"content": [{"token_id": t, "logprob": lp} for t, lp in zip(tokens, logprobs)]}}]}


def test_parse_generation_maps_version_spans_to_tokens():
    gen = parse_generation(_response([5, 6, 7], [-0.1, -0.2, -0.3],
                                     [{"version": "default", "start": 0, "end": 1},
                                      {"version": "4", "start": 1, "end": 3}]))
    assert gen.tokens == [5, 6, 7] and gen.versions == [0, 4, 4]
    assert parse_version("default") == 0 and parse_version("12") == 12


@pytest.mark.parametrize("body", [
    {},
    {"choices": []},
    _response([5, 6], [-0.1], [{"version": "1", "start": 0, "end": 2}]),
    _response([5, 6], [-0.1, -0.2], [{"version": "1", "start": 0, "end": 1}]),
    _response([5], [-0.1], [{"version": "step-7", "start": 0, "end": 1}]),
])
def test_parse_generation_rejects_malformed_responses(body):
    with pytest.raises(InferenceError):
        parse_generation(body)
