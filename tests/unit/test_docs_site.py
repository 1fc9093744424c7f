"""The documentation site builds in strict mode, and the examples on its pages run.

`mkdocs build --strict` fails on a broken link, an anchor no heading defines, a page left out of the nav,
or a README section the home page includes that is gone (mkdocs.yml's `validation`, scripts/mkdocs_readme.py).
"""
from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from turnstream.core.config import Config
from turnstream.core.configtools import from_dict

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _blocks(path: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", path.read_text(), re.S)


def test_site_builds_in_strict_mode_without_warnings(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs-material is not installed (the test extra: pip install 'turnstream[test]')")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # material's notice about its successor is not a page problem
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                          "-d", str(tmp_path / "site")], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    output = run.stdout + run.stderr
    assert run.returncode == 0 and "WARNING" not in output, output
    assert (tmp_path / "site" / "configuration" / "index.html").exists()
    home = (tmp_path / "site" / "index.html").read_text()
    assert 'id="three-commands"' in home and 'id="set-up"' in home  # the README's sections, included
    assert 'href="concepts/"' in home  # the README's table of pages, its links made relative to docs/


def test_every_toml_example_is_a_valid_config():
    pages = [*sorted(DOCS.rglob("*.md")), ROOT / "README.md"]
    checked = 0
    for page in pages:
        for block in _blocks(page, "toml"):
            if "[project" in block or "[tool" in block:  # a package's pyproject.toml, not a run config
                continue
            from_dict(Config, tomllib.loads(block))  # raises ConfigError naming the key
            checked += 1
    assert checked >= 5


def _example_environment():
    (source,) = [b for b in _blocks(DOCS / "environments.md", "python") if "class GuessTheNumber" in b]
    namespace: dict = {"__name__": "docs_example"}
    exec(compile(source, "docs/environments.md", "exec"), namespace)  # noqa: S102 (our own page)
    return namespace["GuessTheNumber"]


def test_the_example_environment_of_train_your_own_task_plays():
    from turnstream.actors.environment import Environment

    env_class = _example_environment()

    async def binary_search(env, task):
        reset = await env.reset(seed=7, task=task)
        low, high, turns = 1, env.high, 0
        observation = reset.observation
        while True:
            guess = (low + high) // 2
            step = await env.step(f"My guess is {guess}.")
            turns += 1
            if step.done:
                return reset, step, turns
            low, high = (guess + 1, high) if step.observation.startswith("Higher") else (low, guess - 1)
            observation = step.observation
            assert observation.endswith("Your guess?")

    env = env_class(high=16, guesses=5)
    assert isinstance(env, Environment) and env.num_tasks == 16
    for task in range(env.num_tasks):
        reset, step, turns = asyncio.run(binary_search(env, task))
        assert reset.prompt_key == f"guess/16/{task + 1}"
        assert step.reward == 1.0 and step.info == {"success": True} and turns <= 5

    async def babble(env):
        await env.reset(seed=3)  # no task: the seed names one
        steps = [await env.step("no idea") for _ in range(5)]
        return steps

    steps = asyncio.run(babble(env_class(high=16, guesses=5)))
    assert [s.done for s in steps] == [False] * 4 + [True]
    assert steps[0].observation.startswith("Not a number.") and steps[-1].reward == 0.0


async def test_the_example_environment_plays_through_the_actor(tiny_model):
    """The page's example, played as an actor plays it: the runner's episodes over its 16 tasks in order, the
    environment loop behind the guard (time limits, loop-block meter), every turn streamed."""
    from turnstream.actors.inference.chat_tokens import ChatTokens
    from turnstream.actors.metrics import ActorMetrics
    from turnstream.actors.play.context import Sampling
    from turnstream.actors.play.env_loop import EnvironmentLoop
    from turnstream.actors.play.runner import EpisodeRunner
    from turnstream.actors.tasks.orders import SequentialOrder
    from turnstream.actors.tasks.source import TaskSource
    from tests.unit.fakes import CollectingLink, ScriptedClient, streams

    env_class, link, metrics = _example_environment(), CollectingLink(), ActorMetrics()
    runner = EpisodeRunner(actor_id="a", epoch=1, player=EnvironmentLoop(lambda: env_class(high=16, guesses=5)),
                           chat=ChatTokens(tiny_model), client=ScriptedClient(), link=link,
                           sampling=Sampling(1.0, 8, 512), metrics=metrics,
                           tasks=TaskSource(SequentialOrder(16, run_seed=0, epochs=1)))
    await asyncio.wait_for(runner.run(4), 60)
    by_stream = streams(link.chunks)
    assert {s[0].prompt_key for s in by_stream.values()} == {f"guess/16/{n}" for n in range(1, 17)}
    assert all(1 <= len(s) <= 5 and s[-1].done and not any(c.done for c in s[:-1]) for s in by_stream.values())
    finished = sum(metrics.registry.get_sample_value("turnstream_actor_episodes_total", {"outcome": o}) or 0
                   for o in ("success", "done"))
    assert finished == 16
