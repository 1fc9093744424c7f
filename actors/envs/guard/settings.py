"""The run's guard settings ([env] of the config), and which time limit applies to an environment's call."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from turnstream.actors.environment import Environment
from turnstream.core.config import EnvSection


@dataclass(frozen=True)
class GuardSettings:
    """`name`: the environment's name in logs and metric labels ("" for its class name)."""

    name: str = ""
    reset_timeout_s: float = 60.0
    step_timeout_s: float = 60.0
    close_timeout_s: float = 10.0
    loop_block_warn_s: float = 0.02
    isolation: Literal["loop", "process"] = "loop"
    workers: int = 0  # 0: auto_workers()
    worker_memory_mb: int = 0  # 0: no limit

    @classmethod
    def from_config(cls, env: EnvSection) -> GuardSettings:
        return cls(env.name, env.reset_timeout_s, env.step_timeout_s, env.close_timeout_s, env.loop_block_warn_s,
                   env.isolation, env.workers, env.worker_memory_mb)

    def reset_limit(self, env: Environment) -> float:
        return _own_or_run(env.reset_timeout_s, self.reset_timeout_s)

    def step_limit(self, env: Environment) -> float:
        return _own_or_run(env.step_timeout_s, self.step_timeout_s)

    def close_limit(self, env: Environment) -> float:
        return _own_or_run(env.close_timeout_s, self.close_timeout_s)

    def worker_count(self) -> int:
        return self.workers or auto_workers()


def _own_or_run(own: float | None, run: float) -> float:
    """The environment's own limit when it says one (it knows its tool), else the run's."""
    return run if own is None else float(own)


def auto_workers() -> int:
    """The machine's CPU count clamped to 2..4: two, so that a crash costs at most half the episodes and one
    worker serves while another is replaced; at most four, since each worker serves many episodes on threads
    (blocking I/O and sleeps overlap within one), and more processes only pay for CPU-bound Python."""
    return max(2, min(4, os.cpu_count() or 1))
