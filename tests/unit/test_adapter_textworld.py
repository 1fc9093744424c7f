"""The `textworld` adapter against the real TextWorld: a game generated locally from a recipe (as tw-make
does) played by script, the score as reward, max_steps truncation, a corrupt game file, bad recipes, and
the recipe's games as the task list."""
from __future__ import annotations

import os
import shutil

import pytest

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

RECIPE = {"challenge": "tw-coin_collector", "settings": {"level": 1}, "seeds": [0]}


@pytest.fixture(scope="module")
def game_file(tmp_path_factory):
    """One game, generated once for the module (TextWorld's compiler takes several seconds a game)."""
    import asyncio

    games_dir = tmp_path_factory.mktemp("tw-games")

    async def make():
        env = make_env("textworld", games_dir=str(games_dir), **RECIPE)
        await env.reset(0)
        await env.close()

    asyncio.run(make())
    (path,) = games_dir.glob("*/game.z8")
    assert not list(games_dir.glob(".making-*")), "no half-made game is left behind"
    return path


async def test_recipe_game_is_played_to_a_win_with_the_score_as_reward(game_file):
    env = make_env("textworld", games_dir=str(game_file.parent.parent), **RECIPE)
    reset = await env.reset(0)  # the recipe's game exists: it is reused, not generated again
    assert reset.prompt_key == f"textworld/{game_file.parent.name}"
    assert "coin" in reset.observation and "$$" not in reset.observation  # objective + room, no banner
    assert reset.observation.endswith("Admissible commands: examine coin, inventory, look, take coin")
    nonsense = await env.step("dance wildly")
    assert not nonsense.done and nonsense.reward == 0.0
    assert "not a verb I recognise" in nonsense.observation and ">" not in nonsense.observation.splitlines()[-1]
    win = await env.step("take coin\nand more text after the command")
    assert win.done and not win.truncated and win.reward == 1.0
    assert win.info == {"success": True, "score": 1, "max_score": 1, "steps": 2}
    await env.close()


async def test_the_recipes_games_are_the_tasks(game_file, tmp_path):
    """Task i plays the game of seeds[i]. The generator is tested by the fixture, once: here each seed's game
    is a copy of that one, put where the recipe keeps it, so only the task-to-game mapping is tested."""
    from turnstream.actors.envs.adapters.textworld_games import GAME_FILE, recipe_dir

    seeds = [0, 3, 9]
    env = make_env("textworld", games_dir=str(tmp_path), **{**RECIPE, "seeds": seeds})
    dirs = [recipe_dir(tmp_path, RECIPE["challenge"], env.settings, seed) for seed in seeds]
    for d in dirs:
        d.mkdir()
        shutil.copy(game_file, d / GAME_FILE)
    assert env.num_tasks == 3
    resets = await sequential_epochs(env)
    assert [resets[i].prompt_key for i in range(3)] == [f"textworld/{d.name}" for d in dirs]
    assert await env.reset(4) == resets[1]  # without a task the seed picks the game, seeds[4 % 3]
    await env.close()
    single = make_env("textworld", game_file=str(game_file))  # a game file is one task
    assert single.num_tasks == 1 and await single.reset(5, task=0) == await single.reset(8)
    await single.close()


async def test_game_file_with_max_steps_truncation(game_file):
    env = make_env("textworld", game_file=str(game_file), max_steps=2, admissible_commands=False)
    reset = await env.reset(5)
    assert "Admissible commands" not in reset.observation and reset.prompt_key == "textworld/game.z8"
    # control characters (which a model can sample) cannot be typed; sent as such, Frotz crashes or hangs
    first, second = await env.step("\x11look\x00"), await env.step("inventory")
    assert not first.done and "-= Cellar =-" in first.observation
    assert second.done and second.truncated and second.info["reason"] == "max_steps"
    assert "carrying nothing" in second.observation
    await env.close()


async def test_the_game_writes_its_files_in_a_scratch_directory_not_the_actors(game_file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = make_env("textworld", game_file=str(game_file))
    await env.reset(0)
    scratch = env.game.workdir
    assert (await env.step("save")).observation.startswith("Ok.")  # Frotz writes game.qzl
    await env.step("script")  # and a transcript
    assert list(tmp_path.iterdir()) == []
    await env.close()
    assert not os.path.exists(scratch)


async def test_a_corrupt_game_file_abandons_the_episode_as_a_library_error(game_file, tmp_path):
    broken = tmp_path / "game.z8"
    shutil.copy(game_file, broken)
    broken.write_bytes(b"\x00" * 64)  # not a story file any more
    env = make_env("textworld", game_file=str(broken))
    with pytest.raises(EnvError) as err:
        await env.reset(0)
    assert err.value.kind == "library"
    await env.close()


def test_bad_recipes_fail_when_the_environment_is_made(tmp_path):
    with pytest.raises(ValueError, match="unknown challenge"):
        make_env("textworld", challenge="tw-nothing")
    with pytest.raises(ValueError, match="has no setting 'level'"):
        make_env("textworld", challenge="tw-simple", settings={"level": 3})
    with pytest.raises(ValueError, match="invalid choice"):
        make_env("textworld", challenge="tw-simple", settings={"rewards": "lots", "goal": "brief"})
    with pytest.raises(ValueError, match="required"):
        make_env("textworld", challenge="tw-coin_collector", settings={})
    with pytest.raises(ValueError, match="seeds must be distinct"):  # two tasks would be one game
        make_env("textworld", seeds=[1, 2, 1])
    with pytest.raises(ValueError, match="does not exist"):
        make_env("textworld", game_file=str(tmp_path / "missing.z8"))


async def test_runner_plays_on_after_a_broken_game(game_file, tmp_path, tiny_model):
    broken = tmp_path / "broken.z8"
    broken.write_bytes(b"garbage")
    files = iter([game_file, broken, game_file])
    metrics, link = ActorMetrics(), CollectingLink()
    runner = EpisodeRunner(actor_id="a", epoch=1, player=EnvironmentLoop(lambda: make_env(
                               "textworld", game_file=str(next(files)), max_steps=3, max_action_tokens=4)),
                           chat=ChatTokens(tiny_model), client=ScriptedClient(seed=0), link=link,
                           sampling=Sampling(1.0, 4, 4096), metrics=metrics, tasks=TaskSource(RandomOrder(0)))
    outcomes = [await runner.play(f"ep{i}", seed=i) for i in range(3)]
    assert outcomes == ["truncated", "env_error", "truncated"]  # scripted gibberish never finds the coin
    assert metrics.registry.get_sample_value("turnstream_actor_env_errors_total", {"kind": "library"}) == 1
    chunks = streams(link.chunks)
    assert [len(chunks["ep0"]), len(chunks["ep2"])] == [3, 3] and chunks["ep0"][-1].truncated
