"""Observation-to-text and text-to-action mappings for the `gymnasium` adapter.

A mapping is any object with the methods of `TextMapping`. Built in: `text` (text observations, the reply
is the action), `discrete` (any observation printed, the reply's integer is the action), and small ones
for FrozenLake, Taxi and Blackjack whose actions are single letters, so sampling can be restricted to
them. A user declares their own by dotted import path (`"my_pkg.mappings:CartPoleText"`, a class
constructed with `mapping_args`, or an instance).
"""
from __future__ import annotations

import importlib
import re
from typing import Any


class TextMapping:
    """The text observation is the observation; the reply, stripped, is the action."""

    action_tokens: list[str] | None = None  # single-token replies to restrict sampling to (None: free text)
    max_action_tokens: int = 16

    def observation_text(self, observation: Any, info: dict, env) -> str:
        if not isinstance(observation, str):
            raise TypeError(f"the text mapping needs str observations, got {type(observation).__name__}")
        return observation

    def action(self, reply: str, env) -> Any | None:
        """The action for `reply`, or None when the reply names no valid action."""
        return reply.strip()

    def action_help(self, env) -> str:
        return "reply with an action the environment accepts"


class DiscreteMapping(TextMapping):
    """Any observation, printed; the first integer in the reply is the action of a Discrete space."""

    max_action_tokens = 4

    def observation_text(self, observation, info, env) -> str:
        return f"observation {observation}"

    def action(self, reply, env):
        match = re.search(r"-?\d+", reply)
        return int(match.group()) if match else None

    def action_help(self, env) -> str:
        space = env.action_space
        return f"reply with an integer from {space.start} to {space.start + space.n - 1}"


class LetterMapping(TextMapping):
    """Actions named by one letter each (the letter's index is the action)."""

    letters = ""
    names: tuple[str, ...] = ()
    max_action_tokens = 1

    def __init__(self):
        self.action_tokens = list(self.letters)

    def action(self, reply, env):
        word = reply.strip().split()[0].strip(".,!:;[]()").upper() if reply.strip() else ""
        if len(word) == 1 and word in self.letters:
            return self.letters.index(word)
        names = [n.upper() for n in self.names]
        return names.index(word) if word in names else None

    def action_help(self, env) -> str:
        return "reply with one letter: " + ", ".join(f"{c} ({n})" for c, n in zip(self.letters, self.names))


class FrozenLakeMapping(LetterMapping):
    """The map with the player as `P`; S start, F frozen, H hole, G goal."""

    letters, names = "LDRU", ("left", "down", "right", "up")

    def observation_text(self, observation, info, env) -> str:
        lake = env.unwrapped
        rows = [[c.decode() for c in row] for row in lake.desc]
        row, col = divmod(int(observation), lake.ncol)
        rows[row][col] = "P"
        return "\n".join("".join(r) for r in rows)


class TaxiMapping(LetterMapping):
    """Where the taxi, the passenger and the destination are (R, G, Y, B are the four stands)."""

    letters, names = "SNEWPD", ("south", "north", "east", "west", "pickup", "dropoff")
    stands = "RGYB"

    def observation_text(self, observation, info, env) -> str:
        taxi_row, taxi_col, passenger, destination = env.unwrapped.decode(int(observation))
        where = "in the taxi" if passenger == 4 else f"at {self.stands[passenger]}"
        stands = ", ".join(f"{s} {loc}" for s, loc in zip(self.stands, env.unwrapped.locs))
        return (f"taxi at ({taxi_row}, {taxi_col}); passenger {where}; destination {self.stands[destination]}; "
                f"stands: {stands}")


class BlackjackMapping(LetterMapping):
    letters, names = "SH", ("stick", "hit")

    def observation_text(self, observation, info, env) -> str:
        total, dealer, usable_ace = observation
        return f"your sum {total}, dealer shows {dealer}, usable ace {'yes' if usable_ace else 'no'}"


BUILTIN = {"text": TextMapping, "discrete": DiscreteMapping, "frozenlake": FrozenLakeMapping,
           "taxi": TaxiMapping, "blackjack": BlackjackMapping}
_BY_ENV = {"FrozenLake": "frozenlake", "FrozenLake8x8": "frozenlake", "Taxi": "taxi", "Blackjack": "blackjack"}


def default_mapping_name(env_id: str, observation_space, action_space) -> str:
    from gymnasium import spaces

    base = env_id.split("/")[-1].split("-v")[0]
    if base in _BY_ENV:
        return _BY_ENV[base]
    if isinstance(observation_space, spaces.Text):
        return "text"
    if isinstance(action_space, spaces.Discrete):
        return "discrete"
    raise ValueError(f"gymnasium: no built-in text mapping fits {env_id} (observations {observation_space}, "
                     f"actions {action_space}); declare one with mapping = \"my_pkg.module:MyMapping\"")


def load_mapping(name: str, args: dict):
    """A built-in mapping by name, or a user's by dotted path ("pkg.mod:Name" or "pkg.mod.Name")."""
    if name in BUILTIN:
        return BUILTIN[name](**args)
    module_name, _, attr = name.partition(":") if ":" in name else name.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"gymnasium: mapping {name!r} is neither built in ({', '.join(BUILTIN)}) "
                         f"nor a dotted path like my_pkg.module:MyMapping")
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"gymnasium: cannot import mapping {name!r}: {exc}") from None
    mapping = target(**args) if isinstance(target, type) else target
    missing = [m for m in ("observation_text", "action") if not callable(getattr(mapping, m, None))]
    if missing:
        raise ValueError(f"gymnasium: mapping {name!r} lacks {', '.join(missing)}")
    return mapping
