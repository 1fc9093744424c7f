"""The agent and verifiers players under the run's guard settings: the agent's own work between its chat calls is
held to env.reset_timeout_s and env.step_timeout_s, the start-up log says where the episodes' code runs, and an
isolation a player cannot apply is refused by `turnstream check` with one line naming the settings."""
from __future__ import annotations

import asyncio
import logging
import time

import pytest

from turnstream.actors.envs.guard.settings import GuardSettings
from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.choose import player_for
from turnstream.actors.play.context import Sampling
from turnstream.actors.play.runner import EpisodeRunner
from turnstream.actors.play.verifiers.player import VerifiersPlayer
from turnstream.actors.tasks.orders import RandomOrder
from turnstream.actors.tasks.source import TaskSource
from turnstream.checks.preflight import preflight
from turnstream.core.config import ConfigError, load_config
from tests.unit.fakes import CollectingLink, ScriptedClient

ENTRY = "tests.unit.test_player_guard:"


async def thinks_before_calling(client, task):
    await asyncio.sleep(30)
    return 1.0


async def calls_then_thinks(client, task):
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    await asyncio.sleep(30)
    return 1.0


async def calls_twice(client, task):
    for _ in range(2):
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    return 1.0


def _runner(tiny_model, entry: str, guard: GuardSettings) -> EpisodeRunner:
    player = player_for("agent", {"entry": ENTRY + entry, "timeout_s": 60}, guard)
    chat = ChatTokens(tiny_model)
    return EpisodeRunner(actor_id="t", epoch=1, player=player, chat=chat,
                         client=ScriptedClient(free_tokens=chat.encode("hello")), link=CollectingLink(),
                         sampling=Sampling(1.0, 8, 512), metrics=ActorMetrics(), tasks=TaskSource(RandomOrder(0)))


def _timeouts(runner: EpisodeRunner) -> float:
    return runner.context.metrics.registry.get_sample_value("turnstream_actor_agent_errors_total",
                                                            {"reason": "timeout"}) or 0.0


@pytest.mark.parametrize("entry", ["thinks_before_calling", "calls_then_thinks"])
async def test_an_agent_holding_the_turn_past_the_env_time_limits_is_abandoned_as_timeout(tiny_model, entry):
    runner = _runner(tiny_model, entry, GuardSettings("agent", reset_timeout_s=0.3, step_timeout_s=0.3))
    started = time.monotonic()
    assert await runner.play("ep", seed=0) == "agent_error"
    assert time.monotonic() - started < 10  # long before the agent's 30 s or the episode's 60 s
    assert _timeouts(runner) == 1


async def test_an_agent_within_the_limits_plays_on_whatever_generation_takes(tiny_model):
    runner = _runner(tiny_model, "calls_twice", GuardSettings("agent", reset_timeout_s=0.3, step_timeout_s=0.3))

    async def slow_generate(*args, _generate=runner.context.client.generate, **kwargs):
        await asyncio.sleep(0.5)  # past both limits: generation is not the agent's own work
        return await _generate(*args, **kwargs)

    runner.context.client.generate = slow_generate
    assert await runner.play("ep", seed=0) == "success"
    assert _timeouts(runner) == 0


def test_the_start_up_log_says_where_the_agent_runs_and_under_which_limits(caplog):
    caplog.set_level(logging.INFO, "turnstream.actor")
    player_for("agent", {"entry": ENTRY + "calls_twice"}, GuardSettings("agent", step_timeout_s=7))
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("env agent: ")]
    assert 'runs on the actor\'s event loop (env.isolation = "loop")' in line and "7s from a reply" in line


def test_an_isolation_a_player_cannot_apply_is_refused_naming_the_settings(tmp_path):
    with pytest.raises(ConfigError, match='^env.isolation: "process" cannot apply to env.name = "agent": '):
        player_for("agent", {"entry": ENTRY + "calls_twice"}, GuardSettings("agent", isolation="process"))
    with pytest.raises(ConfigError, match='^env.isolation: "process" cannot apply to env.name = "verifiers": '):
        VerifiersPlayer.check_isolation("process", "verifiers")
    config = tmp_path / "agent.toml"
    config.write_text(f'[env]\nname = "agent"\nisolation = "process"\nargs = {{ entry = "{ENTRY}calls_twice" }}\n')
    with pytest.raises(ConfigError, match='^env.isolation: "process" cannot apply to env.name = "agent"'):
        preflight(load_config(config))
