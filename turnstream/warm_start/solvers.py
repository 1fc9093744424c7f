"""Scripted solvers of the shipped tasks: each reads only the observations the model reads and answers as the
model must, or, when told to make a mistake, with a wrong answer the task accepts as a move.

A solver plays one episode (a fresh one per episode: goal_walk's remembers the first observation); in tictactoe
it plays both sides, each from its own observations. Tasks without a solver here: the probes (nothing to read)
and the remote and adapter environments (their tasks are not known here).
"""
from __future__ import annotations

import random
import re
from typing import Callable, Protocol

from turnstream.actors.envs.tasks.sokoban import MOVES, push, solve


class Solver(Protocol):
    def act(self, observation: str, mistake: bool, rng: random.Random) -> str:
        """The answer to `observation`: the right one, or a wrong but valid one when `mistake` is set."""
        ...


def _other(side: str) -> str:
    return "R" if side == "L" else "L"


class GoalWalkSolver:
    """The direction is named once, in the first observation ("goal R at 3 pos 0"): walk that way."""

    def __init__(self):
        self.direction = ""

    def act(self, observation: str, mistake: bool, rng: random.Random) -> str:
        named = re.match(r"goal ([LR])\b", observation)
        if named:
            self.direction = named.group(1)
        return _other(self.direction) if mistake else self.direction


class SignSolver:
    """follow_signs ("junction 2 sign L"), its longtail ("corridor 3 no sign": either answer is right) and the
    trails ("37 L"): the sign is the observation's last word."""

    def act(self, observation: str, mistake: bool, rng: random.Random) -> str:
        sign = observation.split()[-1]
        if sign not in ("L", "R"):  # a corridor: nothing to follow, nothing to get wrong
            return rng.choice("LR")
        return _other(sign) if mistake else sign


class SokobanSolver:
    """A move that starts a shortest solution of the board shown; a mistake is one of the other moves."""

    def act(self, observation: str, mistake: bool, rng: random.Random) -> str:
        walls, targets, boxes, player = _parse_board(observation)
        remaining = {}
        for move in MOVES:
            after = push(walls, boxes, player, move)
            depth = None if after is None else solve(walls, targets, after[0], after[1])
            if depth is not None:
                remaining[move] = depth
        best = min(remaining, key=lambda m: (remaining[m], m)) if remaining else rng.choice(list(MOVES))
        return rng.choice([m for m in MOVES if m != best]) if mistake else best


def _parse_board(text: str):
    walls, targets, boxes, player = set(), set(), set(), (0, 0)
    for r, row in enumerate(text.splitlines()):
        for c, cell in enumerate(row):
            if cell == "#":
                walls.add((r, c))
            if cell in "OVS":
                targets.add((r, c))
            if cell in "XV":
                boxes.add((r, c))
            if cell in "PS":
                player = (r, c)
    return walls, targets, boxes, player


class MathToolSolver:
    """Calls the tool with the problem as posed ("compute 37*48-19" -> "calc 37*48-19"), then answers with its
    result ("result 1757" -> "answer 1757"); a mistake is an answer a little off."""

    def act(self, observation: str, mistake: bool, rng: random.Random) -> str:
        result = re.match(r"result (-?\d+)$", observation)
        if not result:
            return f"calc {observation.removeprefix('compute ')}"
        value = int(result.group(1))
        return f"answer {value + rng.choice([-10, -2, -1, 1, 2, 10]) if mistake else value}"


class TicTacToeSolver:
    """Complete a line of its own, else block one of the other side's, else the centre, else a free cell at
    random; a mistake is a free cell at random (still a legal move: the model learns to read the board either
    way)."""

    def act(self, observation: str, mistake: bool, rng: random.Random) -> str:
        from turnstream.actors.envs.tasks.tictactoe import LINES

        first, *rows = observation.splitlines()
        mine = first.split()[-1]
        cells = "".join(rows)
        free = [i for i, c in enumerate(cells) if c == "."]
        if not mistake:
            for side in (mine, "O" if mine == "X" else "X"):  # win, then block
                for line in LINES:
                    marks = [cells[i] for i in line]
                    if marks.count(side) == 2 and marks.count(".") == 1:
                        return str(line[marks.index(".")] + 1)
            if 4 in free:
                return "5"
        return str(rng.choice(free) + 1)


SOLVERS: dict[str, Callable[[], Solver]] = {
    "goal_walk": GoalWalkSolver,
    "follow_signs": SignSolver,
    "follow_signs_longtail": SignSolver,
    "trail": SignSolver,
    "trail_longtail": SignSolver,
    "sokoban": SokobanSolver,
    "math_tool": MathToolSolver,
    "tictactoe": TicTacToeSolver,
}
