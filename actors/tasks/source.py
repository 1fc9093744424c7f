"""Which task each new episode of an actor plays: the task source hands each draw of its order
(tasks/orders.py) to `group_size` consecutive episodes, so that an actor alone completes whole groups (same
seed and task, hence the same prompt_key) for the buffer's group sampling, and it knows which draws are
played in full (the position a restarted actor goes on from, tasks/position.py)."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Sequence

from turnstream.actors.tasks.orders import Assignment, TaskOrder


class TaskSource:
    """Hands each draw of `order` to `group_size` consecutive episodes, and knows which draws are finished."""

    def __init__(self, order: TaskOrder, group_size: int = 1):
        self.order, self.group_size = order, group_size
        self.current: Assignment | None = None
        self.handed = 0  # episodes given the current draw
        self.unfinished: Counter[int] = Counter()  # draw number -> its episodes handed out and not yet played

    def next(self) -> Assignment | None:
        """The next episode's assignment, or None when the order has run out."""
        if self.current is None or self.handed == self.group_size:
            number = self.order.draws
            drawn, self.handed = self.order.draw(), 0
            self.current = None if drawn is None else replace(drawn, draw=number)
            if self.current is None:
                return None
        self.handed += 1
        self.unfinished[self.current.draw] += 1
        return self.current

    def played(self, assignment: Assignment, prompt_keys: Sequence[str]) -> None:
        """An episode of `assignment` has ended (however it ended), with `prompt_keys`; an order that weighs
        tasks by them learns them."""
        self.unfinished[assignment.draw] -= 1
        if self.unfinished[assignment.draw] <= 0:
            del self.unfinished[assignment.draw]
        self.order.played(assignment.task, prompt_keys)

    def resume_point(self) -> int:
        """The first draw not yet played in full: a restart that goes on from here re-plays the draws that
        were in flight (and those after them that had finished) rather than skipping them."""
        partial = [self.current.draw] if self.current is not None and self.handed < self.group_size else []
        return min([*self.unfinished, *partial], default=self.order.draws)

    def resume(self, draws: int) -> None:
        self.order.draws, self.current, self.handed = draws, None, 0
