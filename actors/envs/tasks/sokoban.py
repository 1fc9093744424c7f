"""Text Sokoban on small boards generated from a seed.

Boards are made by reverse play: boxes start on their targets and the player *pulls* them around a
random room for a number of moves, so every generated board can be solved by replaying the pulls as
pushes. A breadth-first solver (`solve`) double-checks that and gives the optimal move count, which the
tests use; boards that are already solved are rejected.

Symbols: `#` wall, `_` floor, `O` target, `X` box, `V` box on target, `P` player, `S` player on target.
One action token per turn: U, D, L or R. Rewards per turn: -0.01 a move, +0.1 for pushing a box onto a
target, -0.1 for pushing one off, +1 when every box is on a target (done). After `max_steps` moves the
episode is truncated.
"""
from __future__ import annotations

import random
from collections import deque

from turnstream.actors.environment import Environment, Reset, Step, register

MOVES = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
Pos = tuple[int, int]


def generate(seed: int, size: int = 6, boxes: int = 1, pulls: int = 12) -> tuple[set[Pos], set[Pos], set[Pos], Pos]:
    """(walls, targets, boxes, player) of a solvable board with a `size` x `size` border of walls."""
    rng = random.Random(seed)
    for _ in range(1000):
        walls = {(r, c) for r in range(size) for c in range(size) if r in (0, size - 1) or c in (0, size - 1)}
        inner = [(r, c) for r in range(1, size - 1) for c in range(1, size - 1)]
        for cell in rng.sample(inner, k=max(0, len(inner) // 8)):  # a few inner walls
            walls.add(cell)
        free = [p for p in inner if p not in walls]
        if len(free) < boxes + 2:
            continue
        picks = rng.sample(free, boxes + 1)
        targets, player = set(picks[:boxes]), picks[boxes]
        box_pos = set(targets)
        for _ in range(pulls * 4):
            dr, dc = rng.choice(list(MOVES.values()))
            step = (player[0] + dr, player[1] + dc)
            if step in walls or step in box_pos:
                continue
            behind = (player[0] - dr, player[1] - dc)  # pulling: the box behind the player follows
            if behind in box_pos and rng.random() < 0.7:
                box_pos.remove(behind)
                box_pos.add(player)
            player = step
        if box_pos != targets and solve(walls, targets, box_pos, player) is not None:
            return walls, targets, box_pos, player
    raise RuntimeError(f"no solvable board for seed {seed}")


def push(walls: set[Pos], boxes: set[Pos], player: Pos, move: str) -> tuple[set[Pos], Pos] | None:
    """The state after one move, or None if the move is blocked."""
    dr, dc = MOVES[move]
    nxt = (player[0] + dr, player[1] + dc)
    if nxt in walls:
        return None
    if nxt in boxes:
        beyond = (nxt[0] + dr, nxt[1] + dc)
        if beyond in walls or beyond in boxes:
            return None
        return (boxes - {nxt}) | {beyond}, nxt
    return boxes, nxt


def solve(walls: set[Pos], targets: set[Pos], boxes: set[Pos], player: Pos, limit: int = 200_000) -> int | None:
    """Fewest moves to put every box on a target (breadth-first search), or None if unsolvable."""
    start = (frozenset(boxes), player)
    seen = {start}
    queue = deque([(start, 0)])
    while queue and len(seen) < limit:
        (bx, pl), depth = queue.popleft()
        if bx == targets:
            return depth
        for move in MOVES:
            out = push(walls, set(bx), pl, move)
            if out is None:
                continue
            state = (frozenset(out[0]), out[1])
            if state not in seen:
                seen.add(state)
                queue.append((state, depth + 1))
    return None


def render(walls: set[Pos], targets: set[Pos], boxes: set[Pos], player: Pos, size: int) -> str:
    rows = []
    for r in range(size):
        row = []
        for c in range(size):
            p = (r, c)
            if p in walls:
                row.append("#")
            elif p == player:
                row.append("S" if p in targets else "P")
            elif p in boxes:
                row.append("V" if p in targets else "X")
            else:
                row.append("O" if p in targets else "_")
        rows.append("".join(row))
    return "\n".join(rows)


@register("sokoban")
class Sokoban(Environment):
    action_tokens = ["U", "D", "L", "R"]
    max_action_tokens = 1

    def __init__(self, size: int = 6, boxes: int = 1, pulls: int = 12, max_steps: int = 20):
        if size < 4 or boxes < 1 or max_steps < 1:
            raise ValueError("sokoban: size >= 4, boxes >= 1 and max_steps >= 1")
        self.size, self.n_boxes, self.pulls, self.max_steps = size, boxes, pulls, max_steps
        self.walls: set[Pos] = set()
        self.targets: set[Pos] = set()
        self.boxes: set[Pos] = set()
        self.player: Pos = (0, 0)
        self.steps = 0

    async def reset(self, seed: int) -> Reset:
        self.walls, self.targets, self.boxes, self.player = generate(seed, self.size, self.n_boxes, self.pulls)
        self.steps = 0
        return Reset(observation=self.board(), prompt_key=f"sokoban/{self.size}x{self.n_boxes}/{seed}")

    def board(self) -> str:
        return render(self.walls, self.targets, self.boxes, self.player, self.size)

    async def step(self, action: str) -> Step:
        self.steps += 1
        move = action.strip()[:1]
        reward = -0.01
        out = push(self.walls, self.boxes, self.player, move) if move in MOVES else None
        if out is not None:
            before = len(self.boxes & self.targets)
            self.boxes, self.player = out
            reward += 0.1 * (len(self.boxes & self.targets) - before)
        if self.boxes == self.targets:
            return Step(self.board(), reward + 1.0, done=True, info={"success": True})
        truncated = self.steps >= self.max_steps
        return Step(self.board(), reward, done=truncated, truncated=truncated, info={"success": False})
