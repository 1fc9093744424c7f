"""The exit status of a command that compares a run with its reproduction (`turnstream replay`, `turnstream
regenerate`): a comparison that reached nothing proves nothing, so it is neither a success nor a difference."""
from __future__ import annotations

EQUAL = 0  # everything compared was equal
DIFFERS = 1  # something compared differed
NOTHING_COMPARED = 3  # (2 is a config error)


def exit_status(compared: int, differs: bool) -> int:
    if not compared:
        return NOTHING_COMPARED
    return DIFFERS if differs else EQUAL


def nothing_compared(why: str) -> str:
    """The line a command prints when it compared nothing."""
    return f"nothing compared: {why}; exit status {NOTHING_COMPARED}"
