"""`textarena`: any game registered in TextArena, every player an agent of turnstream.

Player k of the game is agent k: each player keeps its own conversation and is streamed with its own agent
id, and all players sample from the one policy being trained (self-play). `learner.agent_norm` decides
whether the learner pools the players' advantages (one shared policy) or normalises them per agent (two
separately tracked agents). Rewards are the game's own, handed out when the game ends (`Step.rewards`
for every player); an invalid move is whatever the game makes of it (usually a retry with a warning, then
a loss). An exception raised by the game abandons the episode as an `EnvError` of kind `library`.

Observations: by default (`observation = "new_messages"`) the adapter builds the game without its
observation wrappers and shows each player only the messages it received since its last turn, because its
conversation already holds everything before (TextArena's own LLM wrappers repeat the whole history every
turn, which would grow the context quadratically). Action wrappers registered for the game (e.g. the one
that adds the `[...]` brackets) still apply. `observation = "wrapped"` uses the game exactly as
`textarena.make` builds it and shows what its wrappers return.

Tasks: a game's setup (the secret number, the shuffled board, the deal) is drawn in `reset` from the seed,
so `tasks = n` enumerates n setups: task i is the game reset with seed i (prompt_key `textarena/<game>/<i>`),
and the episode seed then reseeds the generator the rest of the game draws from. A game whose setup ignores
the seed (TicTacToe: an empty board, player 0 first) has exactly one task, `tasks = 1`; more would be copies
under different keys. With `tasks = 0` (the default) the adapter does not enumerate: the episode seed draws
the setup and every episode shares the key `textarena/<game>`. See docs/adapters/textarena.md.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Literal

from turnstream.actors.environment import Environment, Reset, Step
from turnstream.actors.envs.adapters.common import check_task, describe, library_errors, require

LIBRARY, EXTRA = "textarena", "textarena"


@dataclass
class TextArenaArgs:
    game: str = "TicTacToe-v0"  # a TextArena environment id, e.g. "KuhnPoker-v0", "Nim-v0", "Wordle-v0"
    num_players: int = 2
    game_kwargs: dict = field(default_factory=dict)  # overrides of the game's registered arguments
    observation: Literal["new_messages", "wrapped"] = "new_messages"
    max_action_tokens: int = 16
    action_tokens: list[str] | None = None  # e.g. ["0", ..., "8"] for TicTacToe with the bracket wrapper
    tasks: int = 0  # setups to enumerate, task i reset with seed i (1 for a game without a random setup); 0: none

    def validate(self) -> None:
        if self.observation not in ("new_messages", "wrapped"):
            raise ValueError(f"textarena: observation must be new_messages or wrapped, got {self.observation!r}")
        if self.num_players < 1:
            raise ValueError(f"textarena: num_players must be >= 1, got {self.num_players}")
        if self.max_action_tokens < 1:
            raise ValueError("textarena: max_action_tokens must be >= 1")
        if self.tasks < 0:
            raise ValueError(f"textarena: tasks must be >= 0, got {self.tasks}")


# (game, num_players, kwargs, observation) built and reset once in this process, so a bad configuration
# fails when the config is loaded and later episodes do not pay for the check
_CHECKED: set[str] = set()


def build_game(ta, args: TextArenaArgs):
    """The game object: as registered, or without observation wrappers (see the module docstring)."""
    game = ta.make(args.game, **args.game_kwargs)
    if args.observation == "wrapped":
        return game
    while isinstance(game, ta.Wrapper):
        game = game.env
    for wrapper in ta.envs.registration.ENV_REGISTRY[args.game].default_wrappers or []:
        if issubclass(wrapper, ta.ActionWrapper):
            game = wrapper(game)
    return game


def render_messages(player: int, messages: Any, role_names: dict) -> str:
    """New messages for `player`, one a line, `[sender] text`; its own moves are left out (its
    conversation has them already as its replies)."""
    from textarena import ObservationType

    if isinstance(messages, str):  # a wrapper already rendered them
        return messages
    lines = []
    for message in messages or []:
        sender, text = message[0], str(message[1])
        kind = message[2] if len(message) > 2 else None
        if sender == player and kind == ObservationType.PLAYER_ACTION:
            continue
        lines.append(f"[{role_names.get(sender, f'Player {sender}')}] {text.strip()}")
    return "\n".join(lines) or "(no new messages)"


class TextArenaEnv(Environment):
    def __init__(self, **kwargs):
        self.args = TextArenaArgs(**kwargs)
        self.args.validate()
        self.ta = require(LIBRARY, EXTRA)
        if self.args.game not in self.ta.envs.registration.ENV_REGISTRY:
            raise ValueError(f"textarena: unknown game {self.args.game!r} (textarena.envs.registration.ENV_REGISTRY "
                             f"lists the {len(self.ta.envs.registration.ENV_REGISTRY)} registered ids)")
        self.num_agents = self.args.num_players
        self.max_action_tokens = self.args.max_action_tokens
        self.action_tokens = self.args.action_tokens
        self.num_tasks = self.args.tasks or None
        self._check_once()
        self.game = None
        self.player = 0

    @classmethod
    def description(cls) -> str:
        return describe("TextArena games (any registered id), every player an agent, the game's rewards",
                        LIBRARY, EXTRA)

    def _check_once(self) -> None:
        key = repr((self.args.game, self.args.num_players, sorted(self.args.game_kwargs.items()),
                    self.args.observation))
        if key in _CHECKED:
            return
        try:
            # seed=None: TextArena seeds Python's global `random` when given a seed; a check must not
            build_game(self.ta, self.args).reset(num_players=self.args.num_players, seed=None)
        except Exception as exc:
            raise ValueError(f"textarena: {self.args.game} with num_players={self.args.num_players} and "
                             f"game_kwargs={self.args.game_kwargs} cannot start: {type(exc).__name__}: {exc}") from None
        _CHECKED.add(key)

    def _roles(self) -> dict:
        state = getattr(self.game, "state", None)
        return dict(getattr(state, "role_mapping", None) or {})

    def _observe(self) -> tuple[int, str]:
        player, messages = self.game.get_observation()
        return int(player), render_messages(int(player), messages, self._roles())

    async def reset(self, seed: int, task: int | None = None) -> Reset:
        setup = seed if task is None else check_task(LIBRARY, task, self.num_tasks)
        with library_errors(LIBRARY, f"{self.args.game} reset"):
            self.game = build_game(self.ta, self.args)
            self.game.reset(num_players=self.args.num_players, seed=setup)
            if task is not None:
                # TextArena seeded the global generator with the task; later draws (dice, redeals) follow the
                # episode seed instead, as they do without a task
                random.seed(seed)
            self.player, observation = self._observe()
        key = f"textarena/{self.args.game}" + ("" if task is None else f"/{task}")
        return Reset(observation=observation, prompt_key=key, agent=self.player)

    async def step(self, action: str) -> Step:
        mover = self.player
        with library_errors(LIBRARY, f"{self.args.game} step"):
            done, step_info = self.game.step(action=action)
            if not done:
                self.player, observation = self._observe()
                return Step(observation, 0.0, done=False, agent=self.player)
            rewards, game_info = self.game.close()
        rewards = {int(p): float(r) for p, r in (rewards or {}).items()}
        reason = (game_info or {}).get(mover, {}).get("reason") if isinstance(game_info, dict) else None
        info = {"success": rewards.get(mover, 0.0) > 0, "reason": reason, "game_info": game_info,
                "step_info": step_info}
        return Step(str(reason or "game over"), rewards.get(mover, 0.0), done=True, rewards=rewards, info=info)
