"""The pre-flight refuses time limits under which the buffer would abandon a live episode: between two chunks of one
episode (one seat of it) the actor may spend a generate request up to its deadline and an environment step up to
its limit, for every seat of the game in turn, and the buffer drops an episode without a chunk for
buffer.episode_timeout_s."""
from __future__ import annotations

import pytest

from turnstream.actors.environment import Environment, register
from turnstream.checks.preflight import preflight
from turnstream.core.config import ConfigError, load_config


@register("test_slow_tool_step_limit")
class SlowTool(Environment):
    """An environment whose own step limit wins over the run's (docs/environments.md, "Time limits")."""

    step_timeout_s = 500.0

    async def reset(self, seed=None, task=None):
        raise NotImplementedError

    async def step(self, action):
        raise NotImplementedError


def refusal(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        preflight(load_config(None, overrides))
    message = str(info.value)
    assert "\n" not in message and message.startswith("buffer.episode_timeout_s: "), message
    return message


def test_the_defaults_leave_a_turn_room_within_the_episode_timeout():
    cfg = load_config()
    assert cfg.actor.request_timeout_s + cfg.env.step_timeout_s < cfg.buffer.episode_timeout_s
    assert preflight(cfg) is cfg


def test_a_request_deadline_and_a_step_limit_past_the_episode_timeout_are_refused_naming_them():
    message = refusal(["actor.request_timeout_s=100", "env.step_timeout_s=100", "buffer.episode_timeout_s=150"])
    assert "actor.request_timeout_s (100" in message and "env.step_timeout_s (100" in message
    assert "200" in message
    cfg = load_config(None, ["actor.request_timeout_s=100", "env.step_timeout_s=100", "buffer.episode_timeout_s=201"])
    assert preflight(cfg) is cfg


def test_an_environments_own_step_limit_counts_in_place_of_the_runs():
    message = refusal(["env.name=test_slow_tool_step_limit"])
    assert "the environment's own step_timeout_s (500" in message


def test_every_seat_of_a_game_plays_a_turn_between_two_chunks_of_one_seat():
    # tictactoe: two seats, so 2 * (60 + 60) between a seat's chunks
    message = refusal(["env.name=tictactoe", "buffer.episode_timeout_s=200"])
    assert "2 seats" in message and "240" in message
    cfg = load_config(None, ["env.name=tictactoe", "buffer.episode_timeout_s=241"])
    assert preflight(cfg) is cfg


def test_an_agent_player_is_held_to_the_runs_step_limit_with_one_stream():
    agent = ['env.name=agent', 'env.args={entry = "tests.e2e.test_agent_endpoint:weather_agent"}']
    message = refusal([*agent, "buffer.episode_timeout_s=100"])
    assert "env.step_timeout_s (60" in message and "120" in message
    cfg = load_config(None, [*agent, "buffer.episode_timeout_s=121"])
    assert preflight(cfg) is cfg
