"""The `reasoning_gym` adapter against the real reasoning-gym: the dataset's own scorer as the reward,
single-turn and multi-turn with retries, tagged answers, a scorer that raises, bad configurations, and the
dataset's questions as the task list."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

import reasoning_gym
from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.environment import EnvError
from turnstream.actors.envs.registry import make_env
from turnstream.actors.tasks.orders import RandomOrder
from turnstream.actors.tasks.source import TaskSource
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.context import Sampling
from turnstream.actors.play.env_loop import EnvironmentLoop
from turnstream.actors.play.runner import EpisodeRunner
from reasoning_gym.dataset import ProceduralDataset
from tests.unit.fakes import CollectingLink, ScriptedClient, streams
from tests.unit.test_adapter_registry import sequential_epochs


@dataclass
class ExplodingConfig:
    seed: int | None = None
    size: int = 10


class ExplodingDataset(ProceduralDataset):
    """A real reasoning-gym dataset whose scorer has a bug."""

    def __init__(self, config: ExplodingConfig):
        super().__init__(config=config, seed=config.seed, size=config.size)

    def __getitem__(self, idx):
        return {"question": f"what is {idx} + 1?", "answer": str(idx + 1), "metadata": {}}

    def score_answer(self, answer, entry):
        raise KeyError("the scorer's own bug")


if "turnstream_exploding" not in reasoning_gym.factory.DATASETS:
    reasoning_gym.register_dataset("turnstream_exploding", ExplodingDataset, ExplodingConfig)


async def test_single_turn_answer_scored_by_the_dataset():
    env = make_env("reasoning_gym", dataset="basic_arithmetic", config={"size": 20, "seed": 4})
    reset = await env.reset(27)
    assert reset.prompt_key == "reasoning_gym/basic_arithmetic/7" and reset.observation.startswith("Calculate")
    right = env.entry["answer"]
    step = await env.step(f"  {right}\n")
    assert step.done and step.reward == 1.0 and step.info["success"]
    await env.reset(27)
    wrong = await env.step("a lot")
    assert wrong.done and not wrong.truncated and wrong.reward == 0.0 and not wrong.info["success"]


async def test_the_same_question_under_the_same_key_in_every_process():
    """Without a seed reasoning-gym would draw one at random per dataset (per actor process)."""
    from turnstream.actors.envs.adapters import reasoning_gym_env

    first = await make_env("reasoning_gym", dataset="basic_arithmetic").reset(3)
    reasoning_gym_env._DATASETS.clear()  # as a fresh actor process would
    again = await make_env("reasoning_gym", dataset="basic_arithmetic").reset(3)
    assert first == again


async def test_the_datasets_questions_are_the_tasks():
    env = make_env("reasoning_gym", dataset="basic_arithmetic", config={"size": 5, "seed": 4})
    assert env.num_tasks == 5
    resets = await sequential_epochs(env)
    assert [resets[i].prompt_key for i in range(5)] == [f"reasoning_gym/basic_arithmetic/{i}" for i in range(5)]
    assert resets[3].observation.startswith(env.dataset[3]["question"])
    assert await env.reset(8) == resets[3]  # without a task the seed picks the question, seed % size
    await env.reset(0, task=3)
    assert (await env.step(env.dataset[3]["answer"])).reward == 1.0
    assert make_env("reasoning_gym", dataset="basic_arithmetic").num_tasks == 500  # reasoning-gym's default size


async def test_multi_turn_retry_with_the_scorers_verdict():
    env = make_env("reasoning_gym", dataset="basic_arithmetic", config={"size": 20}, max_attempts=3)
    await env.reset(2)
    first = await env.step("12345678")
    score = env.dataset.score_answer("12345678", env.entry)  # basic_arithmetic gives partial credit
    assert score < 1.0 and first.info["score"] == score
    assert not first.done and first.reward == 0.0 and f"scored {score:g} out of 1" in first.observation
    assert "2 attempts left" in first.observation
    second = await env.step(env.entry["answer"])
    assert second.done and second.reward == 1.0 and second.info["attempts"] == 2
    await env.reset(2)
    for _ in range(2):
        assert not (await env.step("no idea")).done
    last = await env.step("still no idea")  # out of attempts: scored and done, not truncated
    assert last.done and not last.truncated and last.reward == 0.0 and last.info["attempts"] == 3


async def test_tagged_answers_use_reasoning_gyms_extractor_and_partial_scores():
    env = make_env("reasoning_gym", dataset="chain_sum", answer_format="tagged", max_attempts=2)
    reset = await env.reset(0)
    assert "<answer>" in reset.observation
    untagged = await env.step(env.entry["answer"])
    assert not untagged.done and "no answer found" in untagged.observation
    tagged = await env.step(f"thinking... <answer> {env.entry['answer']} </answer>")
    assert tagged.done and tagged.reward == 1.0
    # a dataset with graded scores: the reward is the dataset's own partial score
    graded = make_env("reasoning_gym", dataset="letter_counting", config={"size": 5})
    await graded.reset(1)
    step = await graded.step("not a number")
    assert step.reward == graded.dataset.score_answer("not a number", graded.entry)


async def test_a_scorer_that_raises_abandons_the_episode_as_a_library_error():
    env = make_env("reasoning_gym", dataset="turnstream_exploding")
    await env.reset(1)
    with pytest.raises(EnvError, match="KeyError") as err:
        await env.step("2")
    assert err.value.kind == "library"


def test_bad_configurations_fail_when_the_environment_is_made():
    with pytest.raises(ValueError, match="unknown dataset"):
        make_env("reasoning_gym", dataset="no_such_dataset")
    with pytest.raises(ValueError, match="unexpected keyword"):
        make_env("reasoning_gym", dataset="basic_arithmetic", config={"colour": "red"})
    with pytest.raises(ValueError, match="min_terms must be positive"):  # the dataset's own validation
        make_env("reasoning_gym", dataset="basic_arithmetic", config={"min_terms": 0})
    with pytest.raises(ValueError, match="max_attempts"):
        make_env("reasoning_gym", max_attempts=0)


async def test_runner_scores_episodes_and_survives_a_broken_scorer(tiny_model):
    names = iter(["basic_arithmetic", "turnstream_exploding", "basic_arithmetic"])
    metrics, link = ActorMetrics(), CollectingLink()
    player = EnvironmentLoop(lambda: make_env("reasoning_gym", dataset=next(names), max_attempts=2))
    runner = EpisodeRunner(actor_id="a", epoch=1, player=player,
                           chat=ChatTokens(tiny_model), client=ScriptedClient(seed=0), link=link,
                           sampling=Sampling(1.0, 4, 4096), metrics=metrics, tasks=TaskSource(RandomOrder(0)))
    outcomes = [await runner.play(f"ep{i}", seed=i) for i in range(3)]
    assert outcomes == ["done", "env_error", "done"]  # gibberish answers are scored 0, twice each
    assert metrics.registry.get_sample_value("turnstream_actor_env_errors_total", {"kind": "library"}) == 1
    chunks = streams(link.chunks)
    assert [c.done for c in chunks["ep0"]] == [False, True] and chunks["ep0"][0].prompt_key.startswith(
        "reasoning_gym/basic_arithmetic/")
