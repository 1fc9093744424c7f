"""`turnstream bench trl`'s protocol in code (docs/learning.md, "Beside TRL"): the two clocks, the order the runs
go in, the bootstrap interval on a ratio of medians, what a run cost, and the learning-rate grid's choice.
"""
from __future__ import annotations

import datetime
import os
import random
import resource
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

# the actor's line as its episode slots start (actors/main.py): its first sample request follows at the first credit
GENERATING = "episodes generating"
DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class Clocks:
    """A run's two clocks, as wall-clock stamps (time.time()): cold from its first process's launch, warm from its
    first sample request. The seconds to the target are measured on the cold clock; the warm clock leaves out
    the start-up before the first sample."""

    launched_at: float
    first_sample_at: float | None  # None: the run never sampled

    @property
    def startup_s(self) -> float | None:
        return None if self.first_sample_at is None else round(self.first_sample_at - self.launched_at, 2)

    def warm(self, cold_s: float | None) -> float | None:
        if cold_s is None or self.startup_s is None:
            return None
        return round(cold_s - self.startup_s, 1)


def actor_first_sample(log_path: Path) -> float | None:
    """When turnstream's actor started generating: the stamp of the first "episodes generating" line of its log
    (the launcher's logging format, local time to the millisecond); None before it has one."""
    if not log_path.is_file():
        return None
    for line in log_path.read_text(errors="replace").splitlines():
        if GENERATING in line:
            stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            return stamp.timestamp()
    return None


def run_order(tasks: list[str], systems: list[str], seeds: list[int]) -> list[tuple[str, int, str]]:
    """(task, seed, system) in the order they run: per task and seed every system, in the given order on even seed
    positions and reversed on odd ones, so that no system always runs first (or last) after another."""
    return [(task, seed, system) for task in tasks for i, seed in enumerate(seeds)
            for system in (systems if i % 2 == 0 else list(reversed(systems)))]


def bootstrap_ratio(mine: list[float], theirs: list[float], resamples: int = 2000, seed: int = 0,
                    level: float = 0.95) -> tuple[float, float] | None:
    """A percentile bootstrap interval on median(mine) / median(theirs): each side's runs resampled with
    replacement, independently, `resamples` times from a generator seeded with `seed`; None if a side is empty."""
    if not mine or not theirs:
        return None
    rng = random.Random(seed)
    ratios = sorted(statistics.median(rng.choices(mine, k=len(mine))) /
                    statistics.median(rng.choices(theirs, k=len(theirs))) for _ in range(resamples))
    tail = (1.0 - level) / 2.0
    low, high = ratios[int(tail * (resamples - 1))], ratios[int(round((1.0 - tail) * (resamples - 1)))]
    return round(low, 3), round(high, 3)


def spread(values: list[float | None]) -> dict:
    """The median of the known values with their least and most."""
    known = [v for v in values if v is not None]
    if not known:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(known), "min": min(known), "max": max(known)}


@dataclass
class CpuMeter:
    """CPU-seconds of a run: user and system time of every process it started, their own children included, as
    each is reaped (stopping the run reaps them), and apart from them this process's; with the machine's load
    average at its start and end."""

    children_at_start: float
    self_at_start: float
    load_start: tuple[float, float, float]

    @classmethod
    def start(cls) -> "CpuMeter":
        return cls(_cpu(resource.RUSAGE_CHILDREN), _cpu(resource.RUSAGE_SELF), os.getloadavg())

    def stop(self) -> dict:
        return {"cpu_s": round(_cpu(resource.RUSAGE_CHILDREN) - self.children_at_start, 2),
                "bench_cpu_s": round(_cpu(resource.RUSAGE_SELF) - self.self_at_start, 2),
                "load_start": [round(x, 2) for x in self.load_start],
                "load_end": [round(x, 2) for x in os.getloadavg()]}


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def dtype_name(value: str) -> str:
    if value not in DTYPES:
        raise ValueError(f"{value!r}, not one of {', '.join(DTYPES)}")
    return value


def per_system(value: str | None, systems: list[str], parse: Callable[[str], T], flag: str) -> dict[str, T | None]:
    """A setting given once for every system ("1e-3") or per system ("trl=3e-4,turnstream-async=1e-3"; the
    systems not named get None: their default)."""
    out: dict[str, T | None] = dict.fromkeys(systems)
    if not value:
        return out
    try:
        if "=" not in value:
            return dict.fromkeys(systems, parse(value))
        for item in value.split(","):
            system, _, setting = item.partition("=")
            if system not in out:
                raise SystemExit(f"bench trl: {flag}: unknown system {system!r}; known: {', '.join(systems)}")
            out[system] = parse(setting)
    except ValueError as exc:
        raise SystemExit(f"bench trl: {flag}: {exc}") from None
    return out


def best_rates(records: list[dict]) -> dict[str, dict[str, float]]:
    """The learning-rate grid's choice, per task and system: the rate whose runs reached the target most often,
    then the one with the lowest median warm time."""
    by: dict[tuple[str, str], dict[float, list[float | None]]] = {}
    for r in records:
        by.setdefault((r["task"], r["estimator"]), {}).setdefault(r["lr"], []).append(r["warm_s_to_target"])

    def rank(times: list[float | None]) -> tuple[int, float]:
        reached = [t for t in times if t is not None]
        return -len(reached), statistics.median(reached) if reached else float("inf")

    out: dict[str, dict[str, float]] = {}
    for (task, system), rates in by.items():
        out.setdefault(task, {})[system] = min(rates, key=lambda lr: rank(rates[lr]))
    return out
