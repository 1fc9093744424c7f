"""Which tasks held-out evaluation (`tasks.eval_split`) keeps from training.

`split_tasks` holds out round(eval_split * num_tasks) of an enumerating environment's tasks, chosen by a
shuffle seeded with `run.seed` only, so every actor process (and pre-flight) computes the same split without
talking to anyone. `make_order` (tasks/orders.py) gives the training orders only the other tasks; the random
order then draws among them instead of drawing fresh seeds (a seed alone could name a held-out task). A
split needs an enumerating environment: for one that does not, nothing names a task to hold out. The rounds
that play the held-out tasks are actors/evaluation.py's.
"""
from __future__ import annotations

import random

from turnstream.core.configtools import ConfigError


def split_tasks(num_tasks: int, eval_split: float, run_seed: int) -> tuple[list[int], list[int]]:
    """(training tasks, held-out tasks), each sorted: disjoint, together every task in [0, num_tasks)."""
    if not eval_split:
        return list(range(num_tasks)), []
    held = round(eval_split * num_tasks)
    if not 0 < held < num_tasks:
        raise ConfigError(f"tasks.eval_split: {eval_split} of {num_tasks} tasks holds out {held}; it must hold "
                          f"out at least one task and leave at least one to train on")
    order = list(range(num_tasks))
    random.Random(f"{run_seed}/eval_split").shuffle(order)  # the run's seed only: the same on every actor
    return sorted(order[held:]), sorted(order[:held])
