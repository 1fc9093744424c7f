"""The `gymnasium` adapter against the real Gymnasium: built-in mappings for FrozenLake, Taxi and Blackjack,
a text-observation environment, a user's mapping by dotted path, invalid replies, the time limit, an
environment that raises, bad configurations, and seeded starting states as the task list."""
from __future__ import annotations

import gymnasium
import pytest
from gymnasium import spaces

from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.environment import EnvError
from turnstream.actors.envs.registry import make_env
from turnstream.actors.tasks.orders import RandomOrder
from turnstream.actors.tasks.source import TaskSource
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.context import Sampling
from turnstream.actors.play.env_loop import EnvironmentLoop
from turnstream.actors.play.runner import EpisodeRunner
from tests.unit.fakes import CollectingLink, ScriptedClient, streams
from tests.unit.test_adapter_registry import sequential_epochs

LOWERCASE = "abcdefghijklmnopqrstuvwxyz"


class SayTheWord(gymnasium.Env):
    """A text environment: the observation names a word, saying it back wins; "explode" is a bug."""

    observation_space = spaces.Text(max_length=64, charset=LOWERCASE + " ")
    action_space = spaces.Text(max_length=16, charset=LOWERCASE)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.word = ["apple", "river", "stone"][int(self.np_random.integers(3))]
        return f"say {self.word}", {}

    def step(self, action):
        if action == "explode":
            raise RuntimeError("the environment's own bug")
        won = action == self.word
        return f"say {self.word}", float(won), won, False, {}


if "TurnstreamSayTheWord-v0" not in gymnasium.registry:  # the mapping test imports this module again
    gymnasium.register("TurnstreamSayTheWord-v0", entry_point=SayTheWord, max_episode_steps=3)


class CliffText:
    """A user's mapping: CliffWalking's cell as row and column, moves as words."""

    action_tokens = None
    max_action_tokens = 3

    def __init__(self, words=("up", "right", "down", "left")):
        self.words = list(words)

    def observation_text(self, observation, info, env):
        return "row {} col {}".format(*divmod(int(observation), 12))

    def action(self, reply, env):
        word = reply.strip().lower()
        return self.words.index(word) if word in self.words else None


async def test_frozenlake_is_played_with_letters_to_the_goal_and_into_a_hole():
    env = make_env("gymnasium", env_id="FrozenLake-v1", make_kwargs={"is_slippery": False})
    assert env.action_tokens == ["L", "D", "R", "U"] and env.max_action_tokens == 1
    reset = await env.reset(0)
    assert reset.observation == "PFFF\nFHFH\nFFFH\nHFFG" and reset.prompt_key == "gymnasium/FrozenLake-v1"
    steps = [await env.step(a) for a in "RRDDD"]
    assert all(not s.done and s.reward == 0.0 for s in steps)
    goal = await env.step("R")
    assert goal.done and not goal.truncated and goal.reward == 1.0 and goal.info["success"]
    assert goal.observation.endswith("HFFP")
    await env.reset(0)
    hole = await env.step("down")  # the action's name works too
    hole = await env.step("R")
    assert hole.done and hole.reward == 0.0 and not hole.info["success"]


async def test_tasks_are_seeded_starts_and_the_episode_seed_draws_the_rest():
    env = make_env("gymnasium", env_id="Taxi-v4", tasks=5)
    assert env.num_tasks == 5
    resets = await sequential_epochs(env)
    assert len({r.observation for r in resets.values()}) == 5 and resets[3].prompt_key == "gymnasium/Taxi-v4/3"
    untasked = await env.reset(3)  # task i starts where seed i does; without a task, one key as before
    assert untasked.observation == resets[3].observation and untasked.prompt_key == "gymnasium/Taxi-v4"
    assert make_env("gymnasium", env_id="Taxi-v4").num_tasks is None
    blackjack = make_env("gymnasium", env_id="Blackjack-v1", tasks=1)  # the task is the deal, the seed the hit
    deals, hits = set(), set()
    for seed in range(6):
        deals.add((await blackjack.reset(seed, task=0)).observation)
        hits.add((await blackjack.step("hit")).observation)
    assert len(deals) == 1 and len(hits) > 1


async def test_invalid_replies_are_not_sent_and_end_the_episode_after_a_few():
    env = make_env("gymnasium", env_id="FrozenLake-v1", max_invalid_actions=2, invalid_action_reward=-0.5)
    reset = await env.reset(0)
    first = await env.step("jump")
    assert not first.done and first.reward == -0.5 and first.info["invalid_actions"] == 1
    assert "reply with one letter: L (left)" in first.observation and reset.observation in first.observation
    second = await env.step("fly")
    assert second.done and second.truncated and second.info["reason"] == "invalid_actions"


async def test_the_environments_time_limit_truncates():
    env = make_env("gymnasium", env_id="FrozenLake-v1", make_kwargs={"is_slippery": False}, max_episode_steps=2)
    await env.reset(0)
    assert not (await env.step("L")).done
    cut = await env.step("L")
    assert cut.done and cut.truncated and cut.info["reason"] == "time_limit"


async def test_taxi_and_blackjack_built_in_mappings():
    taxi = make_env("gymnasium", env_id="Taxi-v4")
    reset = await taxi.reset(0)
    assert reset.observation.startswith("taxi at (") and taxi.action_tokens == list("SNEWPD")
    illegal_pickup = await taxi.step("P")  # Taxi's own penalty for a pickup away from the passenger
    assert illegal_pickup.reward == -10.0 and not illegal_pickup.done
    blackjack = make_env("gymnasium", env_id="Blackjack-v1")
    reset = await blackjack.reset(3)
    assert reset.observation.startswith("your sum ") and "dealer shows" in reset.observation
    stick = await blackjack.step("stick")
    assert stick.done and stick.reward in (-1.0, 0.0, 1.0, 1.5)


async def test_text_environment_and_a_raising_step():
    env = make_env("gymnasium", env_id="TurnstreamSayTheWord-v0")
    assert env.action_tokens is None  # free text
    reset = await env.reset(1)
    word = reset.observation.removeprefix("say ")
    shouted = await env.step("APPLE!")  # outside the action space's charset: invalid, not sent
    assert "invalid_action" in shouted.info and not shouted.done
    said = await env.step(f" {word}\n")
    assert said.done and said.reward == 1.0 and said.info["success"]
    await env.reset(1)
    with pytest.raises(EnvError, match="RuntimeError") as err:
        await env.step("explode")
    assert err.value.kind == "library"


async def test_a_users_mapping_by_dotted_path():
    env = make_env("gymnasium", env_id="CliffWalking-v1", mapping="tests.unit.test_adapter_gymnasium:CliffText",
                   mapping_args={"words": ["north", "east", "south", "west"]})
    assert env.max_action_tokens == 3 and env.action_tokens is None
    assert (await env.reset(0)).observation == "row 3 col 0"
    step = await env.step("north")
    assert step.observation == "row 2 col 0" and step.reward == -1.0


def test_bad_configurations_fail_when_the_environment_is_made():
    with pytest.raises(ValueError, match="NoSuchEnv"):
        make_env("gymnasium", env_id="NoSuchEnv-v0")
    with pytest.raises(ValueError, match="cannot import mapping"):
        make_env("gymnasium", env_id="FrozenLake-v1", mapping="tests.unit.test_adapter_gymnasium:Missing")
    with pytest.raises(ValueError, match="neither built in"):
        make_env("gymnasium", env_id="FrozenLake-v1", mapping="frozen")
    with pytest.raises(ValueError, match="tasks must be >= 0"):
        make_env("gymnasium", tasks=-2)
    with pytest.raises(ValueError, match="no built-in text mapping fits Pendulum-v1"):
        make_env("gymnasium", env_id="Pendulum-v1")  # continuous actions need a user's mapping


async def test_runner_plays_frozenlake_and_survives_a_raising_environment(tiny_model):
    envs = iter([("FrozenLake-v1", None), ("TurnstreamSayTheWord-v0", "text"), ("FrozenLake-v1", None)])

    def factory():
        env_id, mapping = next(envs)
        return make_env("gymnasium", env_id=env_id, mapping=mapping or "", max_episode_steps=6)

    explode = [ChatTokens(tiny_model).encode("explode")]
    metrics, link = ActorMetrics(), CollectingLink()
    runner = EpisodeRunner(actor_id="a", epoch=1, player=EnvironmentLoop(factory), chat=ChatTokens(tiny_model),
                           client=ScriptedClient(seed=0, free_tokens=explode[0]), link=link,
                           sampling=Sampling(1.0, 8, 4096), metrics=metrics, tasks=TaskSource(RandomOrder(0)))
    outcomes = [await runner.play(f"ep{i}", seed=i) for i in range(3)]
    assert outcomes[1] == "env_error" and set(outcomes[::2]) <= {"success", "done", "truncated"}
    assert metrics.registry.get_sample_value("turnstream_actor_env_errors_total", {"kind": "library"}) == 1
    chunks = streams(link.chunks)
    letters = {ChatTokens(tiny_model).single_token_id(a) for a in "LDRU"}
    assert all(set(c.gen_tokens.tolist()) <= letters for c in chunks["ep0"] + chunks["ep2"])
    assert chunks["ep0"][-1].done
