"""`turnstream bench async`: wall-clock to a target success, synchronous (eta=0) against asynchronous.

Grid: envs x eta x seeds (`--envs follow_signs --etas 0,2 --seeds 0` for a subset), every run with one
estimator (`--estimator`, default the built-in one). Every setting runs the
same code path (buffer admission with eta, decoupled PPO, in-flight weight pushes); eta=0 is generate a
batch, train, push, repeat. One vLLM server is shared by all runs: before each run the bench serves the
initial weights as version 0 and clears the prefix cache (cache salts name versions, which repeat across
runs), so start-up is paid once and not timed.

Per run: seconds to the target rolling success (or not reached within `--cap`), final success, episodes
and tokens, busy fractions (learner in steps, learner in pushes, generation = >= 1 request in flight, all
from monotonic Prometheus counters, delta over the window in which both roles answered), staleness of
trained tokens, push time. In a synchronous run generation and learner time add up to at most the wall
time (each waits for the other); asynchrony shows as their sum going past 1.

`--config FILE` runs a shipped run config instead (e.g. configs/smollm2_arithmetic.toml, the real model): its
model, environment, batch, rates and vLLM settings, with only eta, max_staleness, the seed, the run directory and
`--pin`'s cores set per run; `--batch`, `--lr`, `--concurrent`, `--microbatch-tokens` and `--model` still win
where given.

Defaults without a config (target 0.6, cap 100 s, batch 64, lr 1e-3, window 128) are sized for the 2-core development
machine: the tiny model sits on the 2^-k floor for a number of steps, then rises to 0.9 within about five
more, so a lower target saves little and the step count to leave the floor is what costs; lr 1e-3 left it
in 7-19 steps in single runs where 3e-4 (batch 64) needed 17 to more than 31.

Records go to <out>/records.jsonl (one per run, rewritten per invocation); a table and one JSON line
(benchmarks/async_grid.py) are printed last, after <out>/async_vs_sync.png: wall-clock vs success per eta
(benchmarks/async_report.py).
"""
from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from benchmarks.async_grid import RunRecord, format_table, headline, settings

log = logging.getLogger("benchmarks.async")

ENVS = {  # bench name -> (registered environment, its args)
    "follow_signs": ("follow_signs", {"junctions": [2, 3, 4]}),
    # same signs plus heavy-tailed corridor turns: median 4 turns, 99th percentile 27 (see the env's doc)
    "follow_signs_longtail": ("follow_signs_longtail", {"junctions": [2, 3, 4]}),
}
MAX_MODEL_LEN = 1024  # the longest long-tail episode (28 turns) needs ~750 tokens of context
SEGMENT_TURNS = 4  # --segments alone: a long-tail episode (median 4 turns, 99th percentile 27) trains in pieces
# --pin: each side on its own core, as inference and training run on separate GPUs in production
GENERATION_CPUS, LEARNER_CPUS = (0,), (1,)
# without --config: the tiny model's settings (see the module's doc)
TINY_DEFAULTS = {"envs": ",".join(ENVS), "model": "runs/tiny-model", "batch": 64, "lr": 1e-3, "concurrent": 64,
                 "microbatch_tokens": 2048}


def parse_args(argv):
    p = argparse.ArgumentParser(prog="turnstream bench async")
    p.add_argument("--config", default="", metavar="FILE",
                   help="a run config every run starts from (its environment replaces --envs)")
    p.add_argument("--envs", default=None, help=f"without --config; default {','.join(ENVS)}")
    p.add_argument("--etas", default="0,1,2,4,8")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--target", type=float, default=0.6, help="rolling success to reach")
    p.add_argument("--cap", "--time-limit", dest="cap", type=float, default=100.0,
                   help="per run, seconds; a run not at the target by then counts as not reached")
    p.add_argument("--batch", type=int, default=None, help="episodes per learner batch")
    p.add_argument("--window", type=int, default=128, help="episodes in the rolling success")
    p.add_argument("--concurrent", type=int, default=None, help="episodes in flight in the actor")
    p.add_argument("--lr", type=float, default=None, help="learner learning rate")
    p.add_argument("--estimator", default="", help="learner.estimator for every run (default: the built-in one)")
    p.add_argument("--segments", type=int, nargs="?", const=SEGMENT_TURNS, default=0, metavar="TURNS",
                   help=f"learn from open episodes: buffer.segment_turns for every run (alone: {SEGMENT_TURNS}); "
                   "needs a value-based --estimator")
    p.add_argument("--microbatch-tokens", type=int, default=None,
                   help="learner padded-token budget per micro-batch (episodes sorted by length, so a long-tail "
                        "batch does not pad every episode to its longest)")
    p.add_argument("--out", default="runs/bench-async")
    p.add_argument("--model", default=None, help="default: the config's, or runs/tiny-model")
    p.add_argument("--url", default="", help="a running vLLM server (started with --max-model-len >= 1024)")
    p.add_argument("--pin", action="store_true",
                   help="generation (vLLM server, actor, buffer) on CPU 0, the learner on CPU 1")
    args = p.parse_args(argv)
    if args.config and args.envs is not None:
        p.error("--envs and --config: the config names the environment")
    if not args.config:
        for name, value in TINY_DEFAULTS.items():
            if getattr(args, name) is None:
                setattr(args, name, value)
    base_config(args)  # a bad config file, an unknown estimator, segments without a critic: one line
    return args


def base_config(args):
    """What every run of the grid starts from: --config's file, or the tiny model's bench settings; a flag given
    on the command line wins over either."""
    from turnstream.core.config import load_config

    overrides = ([f"learner.estimator={args.estimator}"] if args.estimator else []) + \
        ([f"buffer.segment_turns={args.segments}"] if args.segments else [])
    cfg = load_config(args.config or None, overrides)
    if not args.config:
        cfg.vllm.max_model_len = MAX_MODEL_LEN
    for value, section, name in ((args.model, cfg.model, "path"), (args.batch, cfg.buffer, "batch_episodes"),
                                 (args.concurrent, cfg.actor, "concurrent_episodes"), (args.lr, cfg.learner, "lr"),
                                 (args.microbatch_tokens, cfg.learner, "max_tokens_per_microbatch")):
        if value is not None:
            setattr(section, name, value)
    return cfg


# ---- counters from the roles' /metrics ---------------------------------------------------------------

COUNTERS = {  # record key -> sample name, summed over labels
    "gen_busy_s": "turnstream_actor_server_busy_seconds_total",
    "tokens_generated": "turnstream_actor_generated_tokens_total",
    "episodes_played": "turnstream_actor_episodes_total",
    "step_s": "turnstream_learner_step_seconds_sum",
    "push_s": "turnstream_learner_weight_push_seconds_sum",
    "wait_s": "turnstream_learner_batch_wait_seconds_sum",
}


@dataclass
class Snapshot:
    at: float  # time.monotonic()
    values: dict[str, float]


def scrape(ports: list[int], counters: dict[str, str] = COUNTERS) -> Snapshot | None:
    """Every `counters` value (record key -> sample name, summed over labels) from these /metrics ports; None
    while one of them does not answer yet."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {name: key for key, name in counters.items()}
    values = dict.fromkeys(counters, 0.0)
    at = time.monotonic()
    for port in ports:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
        except OSError:
            return None
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in wanted:
                    values[wanted[sample.name]] += sample.value
    return Snapshot(at, values)


LATENCY = {f"{key}_{part}": f"turnstream_buffer_turn_to_train_{unit}_{part}"
           for key, unit in (("turn_to_train_s", "seconds"), ("turn_to_train_versions", "versions"))
           for part in ("sum", "count")}


def turn_latency(buffer_port: int) -> dict[str, float | None]:
    """Mean turn-to-train latency so far, in seconds and in policy versions, from the buffer's histograms."""
    snap = scrape([buffer_port], LATENCY)
    out: dict[str, float | None] = {}
    for key in ("turn_to_train_s", "turn_to_train_versions"):
        n = snap.values[f"{key}_count"] if snap else 0
        out[key] = round(snap.values[f"{key}_sum"] / n, 3) if n else None
    return out


# ---- one run -------------------------------------------------------------------------------------------

def run_config(env: str, eta: int, seed: int, url: str, args):
    cfg = base_config(args)
    cfg.vllm.urls = [url]
    if not args.config:
        cfg.env.name, cfg.env.args = ENVS[env][0], dict(ENVS[env][1])
    cfg.buffer.eta = eta
    cfg.buffer.max_staleness = eta + 2
    cfg.run.rolling_episodes = args.window
    cfg.run.seed = seed
    cfg.run.run_dir = str(Path(args.out) / "runs" / f"{env}-eta{eta}-seed{seed}")
    if args.pin:
        cfg.actor.cpus = cfg.buffer.cpus = list(GENERATION_CPUS)
        cfg.learner.cpus = list(LEARNER_CPUS)
        cfg.learner.torch_threads = len(LEARNER_CPUS)
    return cfg


def run_one(env: str, eta: int, seed: int, url: str, args) -> RunRecord:
    from turnstream.launch.stack import LocalStack
    from turnstream.reports.progress import Progress
    from turnstream.reports.run_log import read_steps, rolling_success

    cfg = run_config(env, eta, seed, url, args)
    shutil.rmtree(cfg.run.run_dir, ignore_errors=True)  # the learner appends to learner.jsonl and resumes
    reset_server(url, cfg.model.path, Path(args.out) / "reset-weights")
    progress = Progress(args.window, label=f"{env} eta={eta} seed={seed}")
    t0, started = time.time(), time.monotonic()
    first = last = None
    latency = {"turn_to_train_s": None, "turn_to_train_versions": None}
    with LocalStack(cfg) as stack:
        ports = [stack.cfg.actor.metrics_port, stack.cfg.learner.metrics_port]

        def scrape_first() -> None:
            nonlocal first
            if first is None:
                first = scrape(ports)

        try:
            reached_s = train_until(stack, started, args.cap, args.window, args.target, progress, scrape_first)
            last = scrape(ports)
            latency = turn_latency(stack.cfg.buffer.metrics_port)
        finally:
            progress.close()
    wall = time.monotonic() - started
    steps = read_steps(cfg.run.run_dir)
    r = record(env, eta, seed, args, steps, reached_s, wall, first, last, t0,
               rolling=lambda upto: rolling_success(upto, args.window))
    r.turn_to_train_s, r.turn_to_train_versions = latency["turn_to_train_s"], latency["turn_to_train_versions"]
    return r


def train_until(stack, started: float, cap: float, window: int, target: float, progress,
                on_poll=lambda: None) -> float | None:
    """Poll a running stack until the rolling success over `window` trained episodes reaches `target`, or `cap`
    seconds after `started` (time.monotonic()); the seconds to the target, or None."""
    from turnstream.reports.run_log import read_steps, rolling_success

    while time.monotonic() - started < cap:
        stack.check_alive()
        on_poll()
        steps = read_steps(stack.run_dir)
        progress.update(steps, time.monotonic() - started)
        if sum(s["episodes"] for s in steps) >= window and rolling_success(steps, window) >= target:
            return time.monotonic() - started
        time.sleep(0.5)
    return None


def record(env, eta, seed, args, steps, reached_s, wall, first: Snapshot | None, last: Snapshot | None, t0,
           rolling) -> RunRecord:
    from turnstream.reports.run_log import staleness_totals

    if first is not None and last is not None and last.at > first.at:
        window = last.at - first.at
        delta = {k: last.values[k] - first.values[k] for k in COUNTERS}
        totals = last.values
    else:  # the roles never answered together: no window to measure busy time over
        window, delta, totals = 0.0, dict.fromkeys(COUNTERS, 0.0), dict.fromkeys(COUNTERS, 0.0)
    pushes = [s["push_s"] for s in steps if s.get("push_s") == s.get("push_s")]  # NaN: a failed push
    return RunRecord(
        env=env, eta=eta, seed=seed, target=args.target, cap_s=args.cap,
        seconds_to_target=round(reached_s, 2) if reached_s is not None else None, wall_s=round(wall, 2),
        final_success=rolling(steps) if steps else 0.0,
        episodes=sum(s["episodes"] for s in steps), tokens=sum(s["tokens"] for s in steps),
        episodes_played=totals["episodes_played"], tokens_generated=totals["tokens_generated"],
        learner_busy=delta["step_s"] / window if window else 0.0,
        push_busy=delta["push_s"] / window if window else 0.0,
        learner_wait=delta["wait_s"] / window if window else 0.0,
        generation_busy=delta["gen_busy_s"] / window if window else 0.0, window_s=round(window, 2),
        staleness={str(k): v for k, v in staleness_totals(steps).items()},
        push_s_mean=statistics.mean(pushes) if pushes else None, steps=len(steps),
        first_step_s=round(steps[0]["time"] - t0, 2) if steps else None,
        curve=[[round(s["time"] - t0, 2), round(rolling(steps[: i + 1]), 4)] for i, s in enumerate(steps)],
    )


def reset_server(url: str, model_dir: str, weights_dir: Path) -> None:
    """Serve the initial weights as version 0 before a run: the shared server still holds the previous run's
    policy and version label, and actors start sampling before the new learner is up. The prefix cache
    goes too: requests are salted by version label, and labels repeat from run to run."""
    import asyncio

    import torch
    from transformers import AutoModelForCausalLM

    from turnstream.learner.sync.disk import DiskWeightSync
    from turnstream.learner.weights.buckets import WeightBuckets

    state = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    sync = DiskWeightSync([url], weights_dir, model_dir)
    asyncio.run(sync.push(sync.save(WeightBuckets(state, None), 0), 0))
    request = urllib.request.Request(f"{url}/reset_prefix_cache", data=b"", method="POST")
    urllib.request.urlopen(request, timeout=30).read()


# ---- the grid ------------------------------------------------------------------------------------------

def grid(args) -> list[tuple[str, int, int]]:
    envs = [base_config(args).env.name] if args.config else [e for e in args.envs.split(",") if e]
    if not args.config and (unknown := [e for e in envs if e not in ENVS]):
        raise SystemExit(f"bench async: unknown env(s) {unknown}; known: {', '.join(ENVS)}")
    return [(env, int(eta), int(seed)) for env in envs for eta in args.etas.split(",")
            for seed in args.seeds.split(",")]


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from benchmarks.async_report import RECORDS, plot
    from turnstream.checks.preflight import ensure_model
    from turnstream.launch.processes import ProcessGroup
    from turnstream.launch.vllm_server import start_vllm_server

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = grid(args)
    cfg = base_config(args)
    ensure_model(cfg.model.path)
    records_path = out / RECORDS
    records_path.write_text("")
    (out / "grid.json").write_text(json.dumps(vars(args), indent=1) + "\n")
    procs = ProcessGroup(out)
    records: list[RunRecord] = []
    try:
        server = cfg.vllm.model_copy(update={"cpus": list(GENERATION_CPUS) if args.pin else []})
        url = args.url or start_vllm_server(procs, str(Path(cfg.model.path).resolve()), server, name="vllm-bench")
        for i, (env, eta, seed) in enumerate(runs):
            log.info("run %d/%d: %s eta=%d seed=%d", i + 1, len(runs), env, eta, seed)
            r = run_one(env, eta, seed, url, args)
            records.append(r)
            with records_path.open("a") as f:
                f.write(json.dumps(r.to_dict()) + "\n")
            log.info("%s eta=%d seed=%d: %s s to %.2f, final %.3f, gen busy %.2f, learner busy %.2f", env, eta,
                     seed, r.seconds_to_target, args.target, r.final_success, r.generation_busy, r.learner_busy)
    finally:
        procs.stop_all()
    rows = settings(records)
    print(format_table(rows), flush=True)
    print(plot(out), flush=True)
    print(json.dumps({**headline(rows, args.target, args.cap), "estimator": cfg.learner.estimator}), flush=True)
    return 0
