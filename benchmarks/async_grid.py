"""Bookkeeping of the async-vs-sync grid: per-run records, medians over seeds with a time cap, speedups,
the printed table. No processes here, so all of it is unit-tested.

A run that does not reach the target within the cap counts as the cap. A median is then exact only while
fewer than half the runs were capped; otherwise it is a lower bound on the true median, and a speedup
computed from it is a bound too (`kind` says which way).
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field


@dataclass
class RunRecord:
    env: str
    eta: int
    seed: int
    target: float
    cap_s: float
    seconds_to_target: float | None  # None: not reached within cap_s
    wall_s: float
    final_success: float
    episodes: int  # trained
    tokens: int  # trained (whole sequences, as the learner's batches count them)
    episodes_played: float  # finished by the actor, trained or not
    tokens_generated: float
    learner_busy: float  # seconds in training steps / wall seconds, over the measured window
    push_busy: float  # seconds in weight pushes / wall seconds, same window
    learner_wait: float  # seconds the learner waited for a batch / wall seconds, same window
    generation_busy: float  # seconds with >= 1 request in flight to vLLM / wall seconds, same window
    window_s: float
    staleness: dict[str, int]  # trained action tokens by staleness (policy versions behind)
    push_s_mean: float | None
    steps: int
    first_step_s: float | None  # start of the run to the first learner step (process start-up included)
    curve: list[list[float]] = field(default_factory=list)  # [seconds since run start, rolling success]
    turn_to_train_s: float | None = None  # mean, per trained turn: its chunk's arrival to its batch being served
    turn_to_train_versions: float | None = None  # mean, per trained turn: versions between generation and training

    @property
    def reached(self) -> bool:
        return self.seconds_to_target is not None

    def seconds_or_cap(self) -> float:
        return self.seconds_to_target if self.seconds_to_target is not None else self.cap_s

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RunRecord":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def median_with_cap(records: list[RunRecord]) -> tuple[float, bool]:
    """(median seconds to target with unreached runs at their cap, whether the median is only a lower bound)."""
    values = [r.seconds_or_cap() for r in records]
    capped = sum(not r.reached for r in records)
    return statistics.median(values), capped > (len(records) - 1) // 2


@dataclass
class Setting:
    """One (env, eta) over its seeds; means unless named otherwise."""

    env: str
    eta: int
    runs: int
    reached: int
    median_s: float
    median_is_bound: bool
    final_success: float
    episodes: float
    tokens: float
    learner_busy: float
    push_busy: float
    learner_wait: float
    generation_busy: float
    push_s: float | None
    staleness: dict[int, int]
    turn_to_train_s: float | None = None
    turn_to_train_versions: float | None = None

    @property
    def staleness_mean(self) -> float:
        n = sum(self.staleness.values())
        return sum(k * v for k, v in self.staleness.items()) / n if n else 0.0


def settings(records: list[RunRecord]) -> list[Setting]:
    """One Setting per (env, eta), envs in first-seen order, etas ascending."""
    out = []
    for env in dict.fromkeys(r.env for r in records):
        for eta in sorted({r.eta for r in records if r.env == env}):
            rs = [r for r in records if r.env == env and r.eta == eta]
            median, bound = median_with_cap(rs)
            hist: dict[int, int] = {}
            for r in rs:
                for k, n in r.staleness.items():
                    hist[int(k)] = hist.get(int(k), 0) + int(n)
            pushes = [r.push_s_mean for r in rs if r.push_s_mean is not None]
            out.append(Setting(
                env=env, eta=eta, runs=len(rs), reached=sum(r.reached for r in rs), median_s=median,
                median_is_bound=bound, final_success=statistics.mean(r.final_success for r in rs),
                episodes=statistics.mean(r.episodes for r in rs), tokens=statistics.mean(r.tokens for r in rs),
                learner_busy=statistics.mean(r.learner_busy for r in rs),
                push_busy=statistics.mean(r.push_busy for r in rs),
                learner_wait=statistics.mean(r.learner_wait for r in rs),
                generation_busy=statistics.mean(r.generation_busy for r in rs),
                push_s=statistics.mean(pushes) if pushes else None, staleness=dict(sorted(hist.items())),
                turn_to_train_s=_mean_of(r.turn_to_train_s for r in rs),
                turn_to_train_versions=_mean_of(r.turn_to_train_versions for r in rs)))
    return out


def _mean_of(values) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.mean(known), 3) if known else None


def speedups(rows: list[Setting]) -> dict[str, dict]:
    """Per env: sync median / best async median (the smallest; ties go to the smaller eta).

    kind: "exact"; "lower_bound" when only the sync median is capped (sync is at least that slow);
    "upper_bound" when only the best async median is capped; "unknown" when both are."""
    out = {}
    for env in dict.fromkeys(s.env for s in rows):
        sync = next((s for s in rows if s.env == env and s.eta == 0), None)
        asyncs = [s for s in rows if s.env == env and s.eta > 0]
        if sync is None or not asyncs:
            continue
        best = min(asyncs, key=lambda s: (s.median_s, s.eta))
        kind = {(False, False): "exact", (True, False): "lower_bound", (False, True): "upper_bound",
                (True, True): "unknown"}[(sync.median_is_bound, best.median_is_bound)]
        out[env] = {"sync_s": round(sync.median_s, 2), "async_s": round(best.median_s, 2), "best_eta": best.eta,
                    "speedup": round(sync.median_s / best.median_s, 3), "kind": kind}
    return out


def headline(rows: list[Setting], target: float, cap_s: float) -> dict:
    """The final JSON line: the first environment's speedup (the grid's order), every env under per_env."""
    per_env = speedups(rows)
    first = next(iter(per_env.values()), None)
    seeds = max((s.runs for s in rows), default=0)
    return {"speedup": first["speedup"] if first else None, "sync_s": first["sync_s"] if first else None,
            "async_s": first["async_s"] if first else None, "env": next(iter(per_env), None),
            "kind": first["kind"] if first else None, "target": target, "cap_s": cap_s, "seeds": seeds,
            "median": "over seeds; an unreached run counts as cap_s", "per_env": per_env}


def staleness_text(hist: dict[int, int]) -> str:
    n = sum(hist.values())
    return " ".join(f"{k}:{100 * v / n:.0f}%" for k, v in hist.items()) if n else "-"


def format_table(rows: list[Setting]) -> str:
    head = (f"{'env':22} {'eta':>3} {'to target s':>12} {'reached':>7} {'final':>5} {'episodes':>8} "
            f"{'tokens':>8} {'learner':>7} {'push':>5} {'wait':>5} {'gen':>5} {'push s':>6} {'turn>train':>10}  "
            "staleness of trained tokens")
    lines = [head, "-" * len(head)]
    for s in rows:
        median = f"{'>=' if s.median_is_bound else ''}{s.median_s:.1f}"
        push = f"{s.push_s:.3f}" if s.push_s is not None else "-"
        latency = (f"{s.turn_to_train_s:.1f}s/{s.turn_to_train_versions:.1f}v" if s.turn_to_train_s is not None
                   and s.turn_to_train_versions is not None else "-")
        lines.append(f"{s.env:22} {s.eta:>3} {median:>12} {s.reached:>4}/{s.runs:<2} {s.final_success:>5.2f} "
                     f"{s.episodes:>8.0f} {s.tokens:>8.0f} {s.learner_busy:>7.2f} {s.push_busy:>5.2f} "
                     f"{s.learner_wait:>5.2f} {s.generation_busy:>5.2f} {push:>6} {latency:>10}  {staleness_text(s.staleness)}")
    lines.append("to target s: median over seeds, an unreached run counted as the cap ('>=': the median is a "
                 "lower bound); learner/push/wait/gen: fraction of wall time in training steps, in weight pushes, "
                 "the learner waiting for a batch, with >= 1 generate request in flight; turn>train: mean seconds "
                 "and versions from a turn's arrival at the buffer to its training")
    return "\n".join(lines)
