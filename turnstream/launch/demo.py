"""`turnstream demo`: train the tiny model on the toy walk until it succeeds, then report one JSON line."""
from __future__ import annotations

import json
import shutil
import time

from turnstream.core.config import Config
from turnstream.launch.stack import LocalStack
from turnstream.reports.figures import plot_learning_curve, write_report
from turnstream.reports.progress import Progress
from turnstream.reports.run_log import held_out_summary, read_evals, read_peak_memory, read_steps, rolling_success


def run_demo(cfg: Config) -> dict:
    started = time.monotonic()
    t0 = time.time()
    stop_reason = "time_limit"
    shutil.rmtree(cfg.run.run_dir, ignore_errors=True)  # a demo always starts from scratch
    progress = Progress(cfg.run.rolling_episodes)
    with LocalStack(cfg) as stack:
        run_dir = stack.run_dir
        try:
            while time.monotonic() - started < cfg.run.time_limit_s:
                stack.check_alive()
                steps = read_steps(run_dir)
                progress.update(steps, time.monotonic() - started)
                rolling = rolling_success(steps, cfg.run.rolling_episodes)
                episodes = sum(s["episodes"] for s in steps)
                if episodes >= cfg.run.rolling_episodes and rolling >= cfg.run.target_success:
                    stop_reason = "target_reached"
                    progress.update(steps, time.monotonic() - started, force=True)
                    break
                time.sleep(0.5)
        except KeyboardInterrupt:  # Ctrl-C (or kill -INT) ends the run early: its curve and report still count
            stop_reason = "interrupted"
        finally:
            progress.close()
    steps = read_steps(run_dir)
    png = plot_learning_curve(run_dir, t0=t0)
    report = write_report(run_dir, t0=t0)
    held_out = held_out_summary(read_evals(run_dir))
    return {
        "success_start": steps[0]["return_mean"] if steps else None,
        "success_end": rolling_success(steps, cfg.run.rolling_episodes) if steps else None,
        "episodes": sum(s["episodes"] for s in steps),
        "learner_steps": len(steps),
        "weight_version": steps[-1]["version"] if steps else 0,
        "max_staleness_seen": max((s["staleness_max"] for s in steps), default=0),
        **held_out,
        "wall_s": round(time.monotonic() - started, 1),
        "stop_reason": stop_reason,
        "learning_curve": str(png),
        "report_dir": str(report[0].parent),
        "run_dir": str(run_dir),
        "peak_memory_mib": read_peak_memory(run_dir),
    }


def main(cfg: Config) -> int:
    result = run_demo(cfg)
    print(json.dumps(result), flush=True)
    return {"target_reached": 0, "interrupted": 130}.get(result["stop_reason"], 1)
