"""Two-player tic-tac-toe by self-play: agent 0 plays X, agent 1 plays O, both from the same policy.

Each agent sees the board from its own side ("you are X", cells 1-9, `.` empty) and answers with one digit
token, the cell to take. A win gives the mover +1 and the other side -1; a draw gives both 0; an illegal
move (taken cell, not a digit) loses: -1 for the mover, 0 for the other side (it did nothing wrong). The
seed chooses who starts, so both agents learn to open and to answer.
"""
from __future__ import annotations

import random

from turnstream.actors.environment import Environment, Reset, Step, register

LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]
MARKS = "XO"


def winner(cells: list[str]) -> str | None:
    for a, b, c in LINES:
        if cells[a] != "." and cells[a] == cells[b] == cells[c]:
            return cells[a]
    return None


@register("tictactoe")
class TicTacToe(Environment):
    action_tokens = [str(i) for i in range(1, 10)]
    max_action_tokens = 1
    num_agents = 2

    def __init__(self, random_start: bool = True):
        self.random_start = random_start
        self.cells = ["."] * 9
        self.to_move = 0

    def _observation(self) -> str:
        rows = ["".join(self.cells[r * 3:r * 3 + 3]) for r in range(3)]
        return f"you are {MARKS[self.to_move]}\n" + "\n".join(rows)

    async def reset(self, seed: int) -> Reset:
        self.cells = ["."] * 9
        self.to_move = random.Random(seed).randrange(2) if self.random_start else 0
        start = MARKS[self.to_move]
        return Reset(observation=self._observation(), prompt_key=f"tictactoe/{start}", agent=self.to_move)

    async def step(self, action: str) -> Step:
        mover, other = self.to_move, 1 - self.to_move
        a = action.strip()[:1]
        if not a.isdigit() or a == "0" or self.cells[int(a) - 1] != ".":
            return Step("illegal move", -1.0, done=True, rewards={mover: -1.0, other: 0.0},
                        info={"success": False, "illegal": True})
        self.cells[int(a) - 1] = MARKS[mover]
        if winner(self.cells):
            return Step("you lost", 1.0, done=True, rewards={mover: 1.0, other: -1.0},
                        info={"success": True, "winner": mover})
        if "." not in self.cells:
            return Step("draw", 0.0, done=True, rewards={mover: 0.0, other: 0.0}, info={"success": False})
        self.to_move = other
        return Step(self._observation(), 0.0, done=False, agent=other)
