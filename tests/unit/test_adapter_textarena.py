"""The `textarena` adapter against the real TextArena: scripted games, invalid moves as the game rules them,
a game that raises, bad configurations, the episode runner carrying on after a crash, and seeded setups as
the task list."""
from __future__ import annotations

import random
import re

import pytest

import textarena as ta
from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.environment import EnvError
from turnstream.actors.envs.registry import make_env
from turnstream.actors.tasks.orders import RandomOrder, make_order
from turnstream.actors.tasks.source import TaskSource
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.context import Sampling
from turnstream.actors.play.env_loop import EnvironmentLoop
from turnstream.actors.play.runner import EpisodeRunner
from turnstream.core.configtools import ConfigError
from tests.unit.fakes import CollectingLink, ScriptedClient, streams
from tests.unit.test_adapter_registry import sequential_epochs

DIGITS = [str(i) for i in range(9)]


class CrashingGame(ta.Env):
    """A real TextArena game whose third move raises, as a buggy game would."""

    def reset(self, num_players, seed=None):
        self.state = ta.SinglePlayerState(num_players=num_players, seed=seed)
        self.state.reset(game_state={"moves": 0}, player_prompt_function=lambda **_: "say anything")

    def step(self, action):
        self.state.game_state["moves"] += 1
        if self.state.game_state["moves"] == 3:
            raise ZeroDivisionError("the game's own bug")
        self.state.add_observation(message=f"move {self.state.game_state['moves']}",
                                   observation_type=ta.ObservationType.GAME_MESSAGE)
        return self.state.step()


if "TurnstreamCrash-v0" not in ta.envs.registration.ENV_REGISTRY:
    ta.register("TurnstreamCrash-v0", entry_point=CrashingGame)


async def test_tictactoe_self_play_every_player_is_an_agent_with_the_games_rewards():
    env = make_env("textarena", game="TicTacToe-v0", action_tokens=DIGITS, max_action_tokens=1)
    assert env.num_agents == 2 and env.action_tokens == DIGITS
    reset = await env.reset(3)
    assert reset.agent == 0 and reset.prompt_key == "textarena/TicTacToe-v0"
    assert "You are Player 0 in Tic Tac Toe" in reset.observation and "Available Moves" in reset.observation
    # player 0 takes the top row; the bracket wrapper registered for the game turns "4" into "[4]"
    for move, next_agent in [("0", 1), ("3", 0), ("1", 1), ("4", 0)]:
        step = await env.step(move)
        assert not step.done and step.agent == next_agent and step.reward == 0.0
    # each player sees what happened since its last turn, not its own move again and not the whole history
    assert "[Player 1] [4]" in step.observation and "[Player 0]" not in step.observation
    assert "Tic Tac Toe" not in step.observation
    win = await env.step("2")
    assert win.done and not win.truncated
    assert win.rewards == {0: 1.0, 1: -1.0} and win.reward == 1.0 and win.info["success"]


async def test_tasks_are_seeded_setups_and_the_episode_seed_draws_the_rest():
    env = make_env("textarena", game="FifteenPuzzle-v0", num_players=1, tasks=4)
    assert env.num_tasks == 4
    resets = await sequential_epochs(env)
    assert len({r.observation for r in resets.values()}) == 4  # four shuffled boards
    assert resets[2].prompt_key == "textarena/FifteenPuzzle-v0/2"
    untasked = await env.reset(2)  # task i is the setup seed i draws; without a task, one key as before
    assert untasked.observation == resets[2].observation and untasked.prompt_key == "textarena/FifteenPuzzle-v0"
    await env.reset(11, task=0)
    assert random.random() == random.Random(11).random()  # later draws follow the episode seed
    # TicTacToe's setup ignores the seed: one task; by default no task list, so no sequential order
    assert (await sequential_epochs(make_env("textarena", tasks=1)))[0].prompt_key == "textarena/TicTacToe-v0/0"
    with pytest.raises(ConfigError, match="sequential needs an environment that enumerates"):
        make_order("sequential", env_factory=lambda: make_env("textarena"), actor_seed=0, run_seed=0)


async def test_invalid_move_is_retried_then_lost_as_the_game_rules():
    env = make_env("textarena", game="TicTacToe-v0")
    await env.reset(0)
    await env.step("[4]")
    retry = await env.step("I pass")  # player 1: not a move at all
    assert not retry.done and retry.agent == 1, "the game lets the player resubmit"
    assert "attempted an invalid move" in retry.observation
    lost = await env.step("[4]")  # the taken cell: the second invalid move in a row loses
    assert lost.done and lost.rewards == {1: -1.0, 0: 1.0} and not lost.info["success"]
    assert "occupied" in lost.info["reason"]


async def test_single_player_game_played_to_a_win():
    env = make_env("textarena", game="GuessTheNumber-v0", num_players=1)
    assert env.num_agents == 1
    reset = await env.reset(11)
    low, high, step = 1, 20, None
    for _ in range(10):
        guess = (low + high) // 2
        step = await env.step(f"[{guess}]")
        if step.done:
            break
        assert step.agent == 0
        if "higher" in step.observation.lower():
            low = guess + 1
        elif "lower" in step.observation.lower():
            high = guess - 1
    assert reset.agent == 0 and step.done and step.reward == 1.0 and step.info["success"]


async def test_wrapped_observations_are_what_the_games_wrappers_return():
    env = make_env("textarena", game="TicTacToe-v0", observation="wrapped")
    await env.reset(0)
    step = await env.step("[4]")
    assert "You are Player 1" in step.observation and "[Player 0] [4]" in step.observation


async def test_a_game_that_raises_abandons_the_episode_as_a_library_error():
    env = make_env("textarena", game="TurnstreamCrash-v0", num_players=1)
    await env.reset(0)
    assert not (await env.step("a")).done
    assert "[GAME] move 2" in (await env.step("b")).observation
    with pytest.raises(EnvError, match="ZeroDivisionError") as err:
        await env.step("c")
    assert err.value.kind == "library"


def test_bad_configurations_fail_when_the_environment_is_made():
    with pytest.raises(ValueError, match="unknown game"):
        make_env("textarena", game="NoSuchGame-v0")
    with pytest.raises(ValueError, match="num_players=3"):
        make_env("textarena", game="TicTacToe-v0", num_players=3)
    with pytest.raises(ValueError, match="observation"):
        make_env("textarena", game="TicTacToe-v0", observation="everything")
    with pytest.raises(ValueError, match="tasks must be >= 0"):
        make_env("textarena", tasks=-1)
    # TextArena 0.7.4's ReverseTicTacToe does not even import (a SyntaxError in the game's module)
    with pytest.raises(ValueError, match="ReverseTicTacToe-v0 .* cannot start"):
        make_env("textarena", game="ReverseTicTacToe-v0")


async def test_runner_streams_both_players_and_survives_a_crashing_game(tiny_model):
    metrics, link = ActorMetrics(), CollectingLink()
    games = iter(["TicTacToe-v0", "TurnstreamCrash-v0", "TicTacToe-v0"])

    def factory():
        game = next(games)
        if game == "TicTacToe-v0":
            return make_env("textarena", game=game, action_tokens=DIGITS, max_action_tokens=1)
        return make_env("textarena", game=game, num_players=1, max_action_tokens=2)

    runner = EpisodeRunner(actor_id="a", epoch=1, player=EnvironmentLoop(factory), chat=ChatTokens(tiny_model),
                           client=ScriptedClient(seed=2), link=link, sampling=Sampling(1.0, 4, 4096),
                           metrics=metrics, tasks=TaskSource(RandomOrder(0)))
    outcomes = [await runner.play(f"ep{i}", seed=i) for i in range(3)]
    assert outcomes[0] in ("success", "done") and outcomes[2] in ("success", "done")
    assert outcomes[1] == "env_error"
    assert metrics.registry.get_sample_value("turnstream_actor_env_errors_total", {"kind": "library"}) == 1
    by_stream = streams(link.chunks)
    for ep in ("ep0", "ep2"):
        a0, a1 = by_stream[f"{ep}/a0"], by_stream[f"{ep}/a1"]
        assert {c.agent_id for c in a0} == {0} and {c.agent_id for c in a1} == {1}
        assert a0[-1].done and a1[-1].done
        assert sum(c.reward for c in a0) + sum(c.reward for c in a1) == 0  # zero-sum game
        assert all(re.fullmatch(r"\d", ChatTokens(tiny_model).decode(c.gen_tokens.tolist()))
                   for c in a0 + a1 if c.gen_tokens.size)
