"""The library adapters in the registry: `turnstream envs` lists each with a description, a missing
library is named with its install command and fails clearly when used (never breaking the listing or
other environments), the shipped adapter configs pass the config loader, and every adapter's task list
(`sequential_epochs`, used by each adapter's tests)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from turnstream.actors.environment import Reset
from turnstream.actors.envs.registry import describe, known_envs, make_env
from turnstream.actors.tasks.orders import make_order
from turnstream.actors.envs.adapters.common import LibraryNotInstalled
from turnstream.cli import main as cli_main
from turnstream.core.config import load_config
from turnstream.core.configtools import ConfigError
from turnstream.checks.preflight import preflight

ROOT = Path(__file__).resolve().parents[2]
ADAPTERS = {"textarena": ("textarena", "textarena"), "textworld": ("textworld", "textworld"),
            "reasoning_gym": ("reasoning_gym", "reasoning-gym"), "gymnasium": ("gymnasium", "gymnasium")}
CONFIGS = {"textarena_tictactoe.toml": "textarena", "textworld.toml": "textworld",
           "reasoning_gym.toml": "reasoning_gym", "gymnasium_frozenlake.toml": "gymnasium"}
# arguments that give each adapter three tasks
THREE_TASKS = {"textarena": {"game": "GuessTheNumber-v0", "num_players": 1, "tasks": 3},
               "textworld": {"seeds": [4, 5, 6]}, "reasoning_gym": {"config": {"size": 3}},
               "gymnasium": {"env_id": "Taxi-v4", "tasks": 3}}


def test_turnstream_envs_lists_every_adapter_with_a_description(capsys):
    assert cli_main(["envs"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert set(ADAPTERS) | {"follow_signs", "tictactoe", "http"} <= set(lines)
    for name in ADAPTERS:
        assert len(lines[name].split(None, 1)[1]) > 20 and "not installed" not in lines[name]
    assert "Two-player tic-tac-toe" in lines["tictactoe"]  # built-ins are described by their docstrings


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_a_missing_library_is_listed_and_fails_clearly(name, monkeypatch, capsys):
    module, extra = ADAPTERS[name]
    monkeypatch.setitem(sys.modules, module, None)  # `import <module>` now fails as if not installed
    assert name in known_envs()
    assert describe(name).endswith(f"(not installed: pip install turnstream[{extra}])")
    assert cli_main(["envs"]) == 0
    assert f"not installed: pip install turnstream[{extra}]" in capsys.readouterr().out
    with pytest.raises(LibraryNotInstalled, match=rf"{module} is not installed: pip install turnstream\[{extra}\]"):
        make_env(name)
    with pytest.raises(ConfigError, match=rf"env.args: {module} is not installed"):
        preflight(load_config(None, [f"env.name={name}"]))
    assert make_env("follow_signs") is not None  # the other environments are untouched


def test_a_plugin_that_fails_to_load_does_not_break_the_listing(monkeypatch, capsys):
    from importlib.metadata import EntryPoint

    from turnstream.actors.envs import registry

    real = registry._entry_points()
    broken = EntryPoint("broken_plugin", "no_such_module_anywhere:Env", registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "_entry_points", lambda: {**real, "broken_plugin": broken})
    assert cli_main(["envs"]) == 0
    out = capsys.readouterr().out
    assert "failed to load" in next(line for line in out.splitlines() if line.startswith("broken_plugin"))
    assert all(name in out for name in ADAPTERS)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_shipped_adapter_configs_load(config, tmp_path):
    overrides = []
    if CONFIGS[config] == "textworld":  # the recipe's games are made at the first reset, not by the loader
        overrides.append(f'env.args.games_dir="{tmp_path}"')
    cfg = preflight(load_config(ROOT / "configs" / config, overrides))
    assert cfg.env.name == CONFIGS[config]
    assert cfg.vllm.max_model_len <= 1024  # the tiny model's positions
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("name", sorted(ADAPTERS))
async def test_every_adapter_enumerates_its_tasks_and_refuses_others(name):
    env = make_env(name, **THREE_TASKS[name])
    assert env.num_tasks == 3
    for task in (-1, 3):  # refused before any game is made or generated
        with pytest.raises(ValueError, match=rf"task {task} out of range \[0, 3\)"):
            await env.reset(0, task=task)


async def sequential_epochs(env, epochs: int = 2) -> dict[int, Reset]:
    """Plays `epochs` epochs of a sequential order over `env` and checks what an enumerating adapter promises:
    each epoch names each task once; a task resets to the same instance whatever the episode seed (every epoch
    gives it another); different tasks have different prompt keys. Returns each task's reset."""
    n = env.num_tasks
    draws = list(iter(make_order("sequential", env_factory=lambda: env, actor_seed=0, run_seed=0,
                                 epochs=epochs).draw, None))
    assert [sorted(a.task for a in draws[e * n:(e + 1) * n]) for e in range(epochs)] == [list(range(n))] * epochs
    resets: dict[int, Reset] = {}
    for a in draws:
        reset = await env.reset(a.seed, task=a.task)
        assert resets.setdefault(a.task, reset) == reset, f"task {a.task} changed with the seed"
    await env.close()
    assert len({r.prompt_key for r in resets.values()}) == n
    return resets
