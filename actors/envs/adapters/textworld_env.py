"""`textworld`: text adventures from TextWorld, a game file or a generation recipe.

Observation: the game's text (at reset its objective and the room's description, which is what the intro
says without its ASCII-art banner; after a command the game's reply, without the interpreter's prompt and
status line), followed by the admissible commands when `admissible_commands` is on. Action: the reply's
first line, typed at the game's prompt (control characters become spaces); a command the game does not
understand is answered by the game ("That's not a verb I recognise.") and costs a step. Reward: the
increase of the game's score on that step, so an episode's rewards add up to the final score; `info`
carries `score` and `max_score`. `done` when the game is won or lost; truncated after `max_steps`
commands. Each game runs in a child process (textworld_process.py: the interpreter may exit its process);
a game that fails to load, an interpreter that raises or dies abandons the episode as an `EnvError` of
kind `library`, one that hangs for `step_timeout_s` as kind `timeout`.

Its tasks are its games: a game file is one task; a recipe has one per seed in `seeds` (`num_tasks =
len(seeds)`), task i the game generated from `seeds[i]`, and without a task the episode seed s plays
`seeds[s % len(seeds)]`. A game is deterministic, so the seed does nothing else; the prompt_key names the
game's file (the recipe's directory: challenge, settings digest and seed). See docs/adapters/textworld.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from turnstream.actors.environment import EnvError, Environment, Reset, Step
from turnstream.actors.envs.adapters.common import check_task, describe, library_errors, require
from turnstream.actors.envs.adapters.textworld_games import challenge_settings, default_games_dir, game_for
from turnstream.actors.envs.adapters.textworld_process import GameProcess

LIBRARY, EXTRA = "textworld", "textworld"


@dataclass
class TextWorldArgs:
    game_file: str = ""  # a compiled game (.z8, from tw-make); when empty the recipe below is used
    challenge: str = "tw-coin_collector"  # a TextWorld challenge: tw-coin_collector, tw-simple, tw-cooking, ...
    settings: dict = field(default_factory=lambda: {"level": 1})  # the challenge's tw-make options
    seeds: list[int] = field(default_factory=lambda: [0])  # one game (task) per seed; episode seed s plays seeds[s % n]
    games_dir: str = ""  # where generated games are kept and reused; empty: a directory in the system temp dir
    max_steps: int = 50
    admissible_commands: bool = True  # list the commands the game accepts after every observation
    max_action_tokens: int = 16
    step_timeout_s: float = 30.0  # a game that does not answer a command within this is abandoned

    def validate(self) -> None:
        if self.step_timeout_s <= 0:
            raise ValueError("textworld: step_timeout_s must be > 0")
        if self.max_steps < 1:
            raise ValueError(f"textworld: max_steps must be >= 1, got {self.max_steps}")
        if not self.game_file and not self.seeds:
            raise ValueError("textworld: seeds must name at least one game seed")
        if not self.game_file and len(set(self.seeds)) < len(self.seeds):  # two tasks would be one game
            raise ValueError(f"textworld: seeds must be distinct, got {self.seeds}")
        if self.game_file and not Path(self.game_file).is_file():
            raise ValueError(f"textworld: game_file {self.game_file!r} does not exist")


def strip_prompt(feedback: str) -> str:
    """The game's reply without the interpreter's `>` prompt and the status line printed after it."""
    text = feedback or ""
    cut = text.rfind("\n>")
    return (text[:cut] if cut >= 0 else text).strip()


def typed_command(reply: str) -> str:
    """The reply's first line with control characters made spaces: they cannot be typed at the game's
    prompt, and Frotz crashes or hangs on some of them (NUL, DC1-DC4)."""
    line = reply.strip().splitlines()[0] if reply.strip() else ""
    return "".join(ch if ch.isprintable() else " " for ch in line).strip()


class TextWorldEnv(Environment):
    def __init__(self, **kwargs):
        self.args = TextWorldArgs(**kwargs)
        self.args.validate()
        self.tw = require(LIBRARY, EXTRA)
        self.settings = {} if self.args.game_file else \
            challenge_settings(self.tw, self.args.challenge, self.args.settings)
        self.max_action_tokens = self.args.max_action_tokens
        self.num_tasks = 1 if self.args.game_file else len(self.args.seeds)
        self.game = None
        self.steps = 0
        self.score = 0
        self.key = ""

    @classmethod
    def description(cls) -> str:
        return describe("TextWorld text adventures from a game file or a challenge recipe, score as reward",
                        LIBRARY, EXTRA)

    async def _game_file(self, task: int) -> tuple[Path, str]:
        if self.args.game_file:
            return Path(self.args.game_file), f"textworld/{Path(self.args.game_file).name}"
        game_seed = self.args.seeds[task]
        games_dir = Path(self.args.games_dir) if self.args.games_dir else default_games_dir()
        with library_errors(LIBRARY, f"generating {self.args.challenge} seed {game_seed}"):
            path = await game_for(self.tw, self.args.challenge, self.settings, game_seed, games_dir)
        return path, f"textworld/{path.parent.name}"

    def _observation(self, text: str, state: dict) -> str:
        if not self.args.admissible_commands:
            return text
        commands = state.get("admissible_commands") or []
        return f"{text}\n\nAdmissible commands: {', '.join(commands)}"

    async def reset(self, seed: int, task: int | None = None) -> Reset:
        await self.close()
        task = seed % self.num_tasks if task is None else check_task(LIBRARY, task, self.num_tasks)
        path, self.key = await self._game_file(task)
        infos = dict(admissible_commands=self.args.admissible_commands, objective=True, description=True,
                     max_score=True, score=True, won=True, lost=True)
        self.game = GameProcess(str(path), infos, self.args.step_timeout_s)
        state = (await self.game.call("reset"))["state"]
        self.steps, self.score = 0, int(state.get("score") or 0)
        intro = "\n\n".join(t.strip() for t in (state.get("objective"), state.get("description")) if t)
        return Reset(self._observation(intro or strip_prompt(state["feedback"]), state), prompt_key=self.key)

    async def step(self, action: str) -> Step:
        if self.game is None:
            raise EnvError("textworld: step before reset", "protocol")
        command = typed_command(action)
        reply = await self.game.call("step", command)
        state = reply["state"]
        self.steps += 1
        score = int(reply["score"] or 0)
        reward, self.score = float(score - self.score), score
        won, lost = bool(state.get("won")), bool(state.get("lost"))
        done = bool(reply["done"] or won or lost)
        truncated = not done and self.steps >= self.args.max_steps
        info = {"success": won, "score": score, "max_score": state.get("max_score"), "steps": self.steps}
        if truncated:
            info["reason"] = "max_steps"
        return Step(self._observation(strip_prompt(state["feedback"]), state), reward, done=done or truncated,
                    truncated=truncated, info=info)

    async def close(self) -> None:
        game, self.game = self.game, None
        if game is not None:
            await game.close()
