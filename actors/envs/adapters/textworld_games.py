"""Where the `textworld` adapter's games come from: a game file the user made, or a recipe (a TextWorld
challenge, its settings, a seed) that TextWorld's own generator compiles locally, as `tw-make` does.

Generated games are kept in a directory keyed by the recipe, so every episode, actor process and later run
with the same recipe and seed plays the same file and the generator (several seconds a game) runs once.
A game is compiled in a scratch directory and renamed into place, so processes sharing the directory never
see half a game; two that race both compile and one rename wins.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path

GAME_FILE = "game.z8"


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message):  # argparse would exit the process
        raise ValueError(message)


def challenge_settings(textworld, challenge: str, settings: dict) -> dict:
    """The settings the challenge's own `tw-make` options accept, defaults filled in; ValueError if the
    challenge is unknown or a setting is missing, misspelt or out of its choices."""
    import textworld.challenges  # noqa: F401  (registers the challenges)

    challenges = textworld.challenges.CHALLENGES
    if challenge not in challenges:
        raise ValueError(f"textworld: unknown challenge {challenge!r}; known: {', '.join(sorted(challenges))}")
    parser = _RaisingParser(prog=challenge, add_help=False)
    challenges[challenge][2](parser)
    flags = {a.dest: a for a in parser._actions}
    argv = []
    for key, value in settings.items():
        action = flags.get(key)
        if action is None:
            raise ValueError(f"textworld: {challenge} has no setting {key!r}; it has: {', '.join(sorted(flags))}")
        if isinstance(action, argparse._StoreTrueAction):
            argv += [action.option_strings[0]] if value else []
        else:
            argv += [action.option_strings[0], str(value)]
    try:
        return vars(parser.parse_args(argv))
    except ValueError as exc:
        raise ValueError(f"textworld: {challenge} settings {settings}: {exc}") from None


def default_games_dir() -> Path:
    return Path(tempfile.gettempdir()) / "turnstream-textworld-games"


def recipe_dir(games_dir: Path, challenge: str, settings: dict, seed: int) -> Path:
    digest = hashlib.sha256(json.dumps([challenge, settings], sort_keys=True).encode()).hexdigest()[:12]
    return games_dir / f"{challenge}-{digest}-seed{seed}"


def generate(textworld, challenge: str, settings: dict, seed: int, games_dir: Path) -> Path:
    """The game file for (challenge, settings, seed), compiled now unless it already exists."""
    final = recipe_dir(games_dir, challenge, settings, seed)
    if (final / GAME_FILE).is_file():
        return final / GAME_FILE
    games_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".making-", dir=games_dir))
    try:
        options = textworld.GameOptions()
        options.seeds = seed
        options.path = str(scratch / GAME_FILE)
        options.file_ext = ".z8"
        options.force_recompile = True
        game = textworld.challenges.CHALLENGES[challenge][1](settings, options=options)
        textworld.generator.compile_game(game, options)
        try:
            os.rename(scratch, final)
        except OSError:
            if not (final / GAME_FILE).is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return final / GAME_FILE


# One generation at a time per process (the generator holds global state and is CPU-bound), in a thread so
# the actor's event loop keeps playing; and one per recipe: episodes that need a game being made wait for it.
_GENERATOR_LOCK = threading.Lock()
_PENDING: dict[Path, asyncio.Future] = {}


def _generate_alone(*args) -> Path:
    with _GENERATOR_LOCK:
        return generate(*args)


async def game_for(textworld, challenge: str, settings: dict, seed: int, games_dir: Path) -> Path:
    final = recipe_dir(games_dir, challenge, settings, seed) / GAME_FILE
    if final.is_file():
        return final
    pending = _PENDING.get(final)
    if pending is not None:
        return await asyncio.shield(pending)
    future = _PENDING[final] = asyncio.get_running_loop().create_future()
    try:
        path = await asyncio.to_thread(_generate_alone, textworld, challenge, settings, seed, games_dir)
        future.set_result(path)
        return path
    except BaseException as exc:
        future.set_exception(exc)
        future.exception()  # waiters see it; nobody else needs to retrieve it
        raise
    finally:
        _PENDING.pop(final, None)
