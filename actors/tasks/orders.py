"""Task orders: the distinct draws of tasks an actor's task source (tasks/source.py) hands to its episodes,
configured by the [tasks] table.

A draw is an `Assignment`: the reset seed and, for an environment that enumerates its tasks
(`Environment.num_tasks`), the task index. For an environment that does not, the seed is the task: two
episodes reset with the same seed play the same task instance.

Orders:
- `RandomOrder`: draw i is seed `actor_seed * 1_000_003 + i`, no task index: a fresh random task each time;
  with tasks held out for evaluation (`tasks.eval_split`, tasks/eval_split.py) a training task drawn
  uniformly, with that seed;
- `SequentialOrder`: epochs over the training task list, each shuffled with the run's seed, its positions split
  between the actor processes (actor k of N takes positions k, k + N, ...); ends after `epochs` passes (0: never);
- `SpoOrder`: SPO's curriculum (actors/tasks/curriculum.py), tasks weighed by the learner's tracker values.
Another order is a `TaskOrder` (its `draw()`, and `played()` if it learns from what episodes produced), and a
case of `make_order`, which hands the orders that enumerate the training task list: every task but those
`tasks.eval_split` holds out for evaluation, which no training order may draw.
"""
from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from turnstream.actors.tasks.curriculum import PRIOR_VALUE, TrackerValues, spo_weight
from turnstream.actors.tasks.eval_split import split_tasks
from turnstream.core.configtools import ConfigError


@dataclass(frozen=True)
class Assignment:
    seed: int  # passed to Environment.reset
    task: int | None = None  # index in [0, num_tasks) for an enumerating environment; None: the seed is the task
    draw: int = field(default=-1, compare=False)  # the order's draw number (TaskSource sets it)


class TaskOrder(ABC):
    draws: int  # draws made so far; setting it makes a deterministic order go on from there

    @abstractmethod
    def draw(self) -> Assignment | None:
        """The next distinct task, or None when the order has run out."""

    def played(self, task: int | None, prompt_keys: Sequence[str]) -> None:
        """An episode of `task` ended with these prompt keys; an order that weighs tasks by them learns them."""


class RandomOrder(TaskOrder):
    def __init__(self, actor_seed: int, tasks: Sequence[int] | None = None):
        """`tasks`: the task indices to draw from; None: no task index, the seed is the task."""
        self.actor_seed, self.draws = actor_seed, 0
        self.tasks = None if tasks is None else list(tasks)
        self.rng = random.Random(actor_seed)

    def draw(self) -> Assignment:
        seed = self.actor_seed * 1_000_003 + self.draws
        self.draws += 1
        return Assignment(seed) if self.tasks is None else Assignment(seed, task=self.rng.choice(self.tasks))


class SequentialOrder(TaskOrder):
    def __init__(self, tasks: int | Sequence[int], *, run_seed: int, epochs: int = 0, shard: int = 0,
                 num_shards: int = 1):
        """`tasks`: the task indices an epoch visits (n: every task of range(n))."""
        self.tasks = list(range(tasks)) if isinstance(tasks, int) else [int(t) for t in tasks]
        if not self.tasks:
            raise ValueError(f"a sequential order needs at least one task, got {tasks}")
        self.num_tasks, self.run_seed, self.epochs = len(self.tasks), run_seed, epochs
        self.span = max(self.tasks) + 1  # seed epoch * span + task: distinct over the run
        self.shard, self.num_shards = shard, num_shards
        self.draws = 0
        self.epoch, self.order = 0, self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(self.tasks)
        random.Random(f"{self.run_seed}/{epoch}").shuffle(order)  # the same for every actor of the run
        return order

    def draw(self) -> Assignment | None:
        # draw n of shard k is place k + n * num_shards of the run's sequence of epochs
        epoch, position = divmod(self.shard + self.draws * self.num_shards, self.num_tasks)
        if self.epochs and epoch >= self.epochs:
            return None
        if epoch != self.epoch:
            self.epoch, self.order = epoch, self._permutation(epoch)
        self.draws += 1
        task = self.order[position]
        # the seed is the task's place in the run, so a stochastic task differs between epochs
        return Assignment(seed=epoch * self.span + task, task=task)


class SpoOrder(TaskOrder):
    """Draws from `tasks` (task indices of an enumerating environment) with SPO's curriculum weights."""

    def __init__(self, tasks: Sequence[int], values: TrackerValues, *, epsilon: float, actor_seed: int):
        if not tasks:
            raise ValueError("the spo order needs at least one task")
        self.tasks, self.values, self.epsilon = np.asarray(tasks, np.int64), values, epsilon
        self.actor_seed, self.draws = actor_seed, 0
        self.rng = np.random.default_rng(actor_seed)
        self.position = {int(t): i for i, t in enumerate(self.tasks)}
        self.keys: dict[int, tuple[str, ...]] = {}  # task -> the prompt keys its episodes produced
        self.weights = np.full(len(self.tasks), spo_weight(PRIOR_VALUE, epsilon))
        self.weighed_at = -1  # values.changes when the weights were last computed

    def played(self, task: int | None, prompt_keys: Sequence[str]) -> None:
        if task is not None and prompt_keys and task in self.position:
            self.keys[task] = tuple(prompt_keys)
            self.weighed_at = -1

    def task_value(self, task: int) -> float:
        known = [self.values.values[k] for k in self.keys.get(task, ()) if k in self.values.values]
        return sum(known) / len(known) if known else PRIOR_VALUE

    def _reweigh(self) -> None:
        for task in self.keys:  # tasks never played keep the prior's weight
            self.weights[self.position[task]] = spo_weight(self.task_value(task), self.epsilon)
        self.weighed_at = self.values.changes

    def draw(self) -> Assignment:
        if self.weighed_at != self.values.changes:
            self._reweigh()
        i = int(self.rng.choice(len(self.tasks), p=self.weights / self.weights.sum()))
        # a fresh seed per draw: the task is fixed by its index, the seed varies what the environment randomises
        seed = self.actor_seed * 1_000_003 + self.draws
        self.draws += 1
        return Assignment(seed=seed, task=int(self.tasks[i]))


def num_tasks_of(env) -> int | None:
    """The environment's task count, or None when it does not enumerate its tasks."""
    n = getattr(env, "num_tasks", None)
    return None if n is None else int(n)


def make_order(order: str, *, env_factory: Callable[[], object], actor_seed: int, run_seed: int, epochs: int = 0,
               shard: int = 0, num_shards: int = 1, values: TrackerValues | None = None,
               spo_epsilon: float = 0.05, eval_split: float = 0.0) -> TaskOrder:
    """The order named by `tasks.order`; `env_factory` makes an instance of the run's environment, asked for its
    task count by the orders that need it; `values`: the learner's tracker values the spo order weighs by;
    `eval_split`: the fraction of the tasks held out for evaluation, which the order never draws."""
    if order not in ("random", "sequential", "spo"):
        raise ConfigError(f"tasks.order: unknown order {order!r}")
    if order == "random" and not eval_split:
        return RandomOrder(actor_seed)
    env = env_factory()
    n = num_tasks_of(env)
    if not n and order != "random":
        raise ConfigError(f"tasks.order: {order} needs an environment that enumerates its tasks "
                          f"(num_tasks); {type(env).__name__} does not, use order = \"random\"")
    if not n:
        raise ConfigError(f"tasks.eval_split: holding out evaluation tasks needs an environment that enumerates "
                          f"its tasks (num_tasks); {type(env).__name__} does not, set eval_split = 0")
    train, _ = split_tasks(n, eval_split, run_seed)  # every task when eval_split is 0
    if order == "random":
        return RandomOrder(actor_seed, train)
    if order == "sequential":
        return SequentialOrder(train, run_seed=run_seed, epochs=epochs, shard=shard, num_shards=num_shards)
    return SpoOrder(train, values or TrackerValues(), epsilon=spo_epsilon, actor_seed=actor_seed)
