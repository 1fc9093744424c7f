"""The episode runner: several agents per episode, reward bookkeeping, truncation, failures counted."""
from __future__ import annotations

import asyncio

import numpy as np

from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.environment import EnvError, Environment, Reset, Step
from turnstream.actors.envs.registry import make_env
from turnstream.actors.tasks.orders import RandomOrder
from turnstream.actors.tasks.source import TaskSource
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.context import Sampling
from turnstream.actors.play.env_loop import EnvironmentLoop
from turnstream.actors.play.runner import EpisodeRunner
from tests.unit.fakes import CollectingLink, ScriptedClient, streams


def _runner(tiny_model, factory, client=None, link=None, max_turns=0, metrics=None):
    return EpisodeRunner(actor_id="a", epoch=1, player=EnvironmentLoop(factory), chat=ChatTokens(tiny_model),
                         client=client or ScriptedClient(), link=link or CollectingLink(),
                         sampling=Sampling(1.0, 16, 512, max_turns), metrics=metrics or ActorMetrics(),
                         tasks=TaskSource(RandomOrder(0)))


def _counter(metrics, name, **labels) -> float:
    return metrics.registry.get_sample_value(name, labels or None) or 0.0


async def test_tictactoe_self_play_streams_one_token_stream_per_agent(tiny_model):
    client, link = ScriptedClient(seed=1), CollectingLink()
    runner = _runner(tiny_model, lambda: make_env("tictactoe"), client, link)
    outcomes = [await runner.play(f"ep{i}", seed=i) for i in range(40)]
    by_stream = streams(link.chunks)
    assert set(outcomes) <= {"success", "done"}
    for i in range(40):
        a0, a1 = by_stream.get(f"ep{i}/a0"), by_stream.get(f"ep{i}/a1")
        assert a0 and a1, "both sides play"
        for agent, chunks in ((0, a0), (1, a1)):
            assert [c.turn for c in chunks] == list(range(len(chunks)))
            assert all(c.agent_id == agent for c in chunks)
            assert [c.done for c in chunks] == [False] * (len(chunks) - 1) + [True]
            assert chunks[0].prompt_key.endswith(f"/a{agent}")
        r0, r1 = sum(c.reward for c in a0), sum(c.reward for c in a1)
        # a win is +1/-1, a draw 0/0, an illegal move -1 for the offender and 0 for the other side
        assert (r0, r1) in {(1.0, -1.0), (-1.0, 1.0), (0.0, 0.0), (-1.0, 0.0), (0.0, -1.0)}
    # the side that did not make the last move gets a closing chunk with no generated tokens
    closing = [s[-1] for s in by_stream.values() if s[-1].gen_tokens.size == 0]
    assert closing and all(c.obs_tokens.size == 0 for c in closing)
    assert {-1.0, 1.0} <= {sum(c.reward for c in s) for s in by_stream.values()}


async def test_each_agent_stream_is_exactly_the_context_it_was_sampled_from(tiny_model):
    """Concatenating a stream's obs+gen tokens gives each context vLLM saw, as a prefix, turn by turn."""
    client, link = ScriptedClient(seed=2), CollectingLink()
    runner = _runner(tiny_model, lambda: make_env("tictactoe"), client, link)
    await runner.play("ep", seed=0)
    contexts = iter(client.calls)
    by_stream = streams(link.chunks)
    order = sorted((c for c in link.chunks if c.gen_tokens.size), key=lambda c: c.seq)
    for c in order:
        history = by_stream[c.episode_id][: c.turn + 1]
        expected = np.concatenate([np.concatenate([h.obs_tokens, h.gen_tokens]) for h in history[:-1]]
                                  + [history[-1].obs_tokens]).tolist()
        assert next(contexts) == expected


async def test_a_frozen_agent_plays_from_its_own_servers_and_is_never_streamed(tiny_model):
    trained, fixed, link, metrics = ScriptedClient(seed=3), ScriptedClient(seed=4), CollectingLink(), ActorMetrics()
    runner = EpisodeRunner(actor_id="a", epoch=1, player=EnvironmentLoop(lambda: make_env("tictactoe")),
                           chat=ChatTokens(tiny_model), client=trained, link=link, sampling=Sampling(1.0, 16, 512),
                           metrics=metrics, tasks=TaskSource(RandomOrder(0)), frozen_clients={1: fixed})
    for i in range(10):
        await runner.play(f"ep{i}", seed=i)
    assert trained.calls and fixed.calls  # both sides moved, each from its own policy's servers
    assert {c.agent_id for c in link.chunks} == {0}  # only the trained side reaches the buffer
    by_stream = streams(link.chunks)
    assert set(by_stream) == {f"ep{i}/a0" for i in range(10)}
    assert all(s[-1].done for s in by_stream.values())
    # agent 0 sampled exactly as many turns as its stream carries generated turns
    assert sum(1 for c in link.chunks if c.gen_tokens.size) == len(trained.calls)
    assert _counter(metrics, "turnstream_actor_frozen_policy_tokens_total") > 0


async def test_single_agent_keeps_plain_episode_ids(tiny_model):
    link = CollectingLink()
    runner = _runner(tiny_model, lambda: make_env("follow_signs"), link=link)
    assert await runner.play("ep", seed=0) in {"success", "done"}
    assert {c.episode_id for c in link.chunks} == {"ep"} and {c.agent_id for c in link.chunks} == {0}


async def test_sokoban_episode_truncates_on_turn_budget(tiny_model):
    link, metrics = CollectingLink(), ActorMetrics()
    runner = _runner(tiny_model, lambda: make_env("sokoban", max_steps=100), link=link, max_turns=3,
                     metrics=metrics)
    assert await runner.play("ep", seed=5) == "truncated"
    assert [c.done for c in link.chunks] == [False, False, False, True]
    assert link.chunks[-1].truncated and link.chunks[-1].gen_tokens.size == 0
    assert all(c.reward < 0 for c in link.chunks[:3])  # per-turn move cost


class Failing(Environment):
    def __init__(self, fail_at: int, error: Exception):
        self.fail_at, self.error, self.turn = fail_at, error, 0

    async def reset(self, seed):
        return Reset("go", "failing")

    async def step(self, action):
        self.turn += 1
        if self.turn >= self.fail_at:
            raise self.error
        return Step("again", 0.0, False)


async def test_environment_failures_abandon_the_episode_and_are_counted(tiny_model):
    metrics, link = ActorMetrics(), CollectingLink(credits=6)
    errors = iter([EnvError("server died", "connection"), RuntimeError("bug"), EnvError("x", "timeout")] * 2)
    runner = _runner(tiny_model, lambda: Failing(2, next(errors)), link=link, metrics=metrics)
    task = asyncio.create_task(runner.run(2))
    for _ in range(200):
        await asyncio.sleep(0.01)
        if _counter(metrics, "turnstream_actor_episodes_total", outcome="env_error") == 6:
            break
    task.cancel()
    assert _counter(metrics, "turnstream_actor_episodes_total", outcome="env_error") == 6
    assert _counter(metrics, "turnstream_actor_env_errors_total", kind="connection") == 2
    assert _counter(metrics, "turnstream_actor_env_errors_total", kind="exception") == 2
    assert not any(c.done for c in link.chunks)  # abandoned episodes are left to expire in the buffer


async def test_bad_agent_id_from_environment_is_an_env_error(tiny_model):
    class Wrong(Environment):
        async def reset(self, seed):
            return Reset("go", "wrong", agent=3)

    metrics = ActorMetrics()
    assert await _runner(tiny_model, Wrong, metrics=metrics).play("ep", 0) == "env_error"
    assert _counter(metrics, "turnstream_actor_env_errors_total", kind="bad_agent") == 1
