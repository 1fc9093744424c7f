"""`turnstream bench async`: wall-clock to a target success, synchronous (eta=0) against asynchronous.

Every setting runs the same code path (buffer admission with eta, decoupled PPO, in-flight weight
pushes); eta=0 is generate-a-batch, train, push, repeat. One vLLM server is shared by all runs (its
weights are reset by each learner's initial push), so start-up is paid once and not timed.
Prints a table and, last, one JSON line with `speedup` = median over seeds of
(sync seconds to target) / (best async seconds to target), plus `sync_s` and `async_s`.
"""
from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import urllib.request
from pathlib import Path

ENVS = {
    "follow_signs": {"junctions": [2, 3, 4]},
    # long-tail episode lengths, as agent tasks have: most episodes short, a few very long
    "follow_signs_longtail": {"junctions": [2, 2, 2, 2, 3, 3, 4, 6, 10, 16]},
}


def _parse(argv):
    p = argparse.ArgumentParser(prog="turnstream bench async")
    p.add_argument("--envs", default="follow_signs,follow_signs_longtail")
    p.add_argument("--etas", default="0,1,2,4,8")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--target", type=float, default=0.9)
    p.add_argument("--time-limit", type=float, default=240.0, help="per run, seconds")
    p.add_argument("--out", default="runs/bench-async")
    p.add_argument("--model", default="runs/tiny-model")
    return p.parse_args(argv)


class VllmBusySampler(threading.Thread):
    """Polls vLLM's /metrics: the fraction of samples with at least one running request."""

    def __init__(self, url: str, period_s: float = 0.25):
        super().__init__(daemon=True)
        self.url, self.period_s = url, period_s
        self.busy = self.total = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.period_s):
            try:
                text = urllib.request.urlopen(f"{self.url}/metrics", timeout=2).read().decode()
            except OSError:
                continue
            running = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                          if line.startswith("vllm:num_requests_running"))
            self.total += 1
            self.busy += running > 0

    @property
    def fraction(self) -> float:
        return self.busy / self.total if self.total else 0.0


def run_one(env: str, eta: int, seed: int, url: str, args) -> dict:
    from turnstream.config import Config
    from turnstream.launcher import LocalStack
    from turnstream.report import read_steps, rolling_success

    cfg = Config()
    cfg.vllm.urls = [url]
    cfg.model.path = args.model
    cfg.env.name = "follow_signs"
    cfg.env.args = ENVS[env]
    cfg.buffer.eta = eta
    cfg.buffer.max_staleness = eta + 2
    cfg.run.seed = seed
    cfg.run.run_dir = str(Path(args.out) / f"{env}-eta{eta}-seed{seed}")
    _reset_server(url, args.model, Path(cfg.run.run_dir) / "reset-weights")
    sampler = VllmBusySampler(url)
    started = time.monotonic()
    reached_s = None
    with LocalStack(cfg) as stack:
        sampler.start()
        while time.monotonic() - started < args.time_limit:
            stack.check_alive()
            steps = read_steps(stack.run_dir)
            if steps and sum(s["episodes"] for s in steps) >= cfg.run.rolling_episodes \
                    and rolling_success(steps, cfg.run.rolling_episodes) >= args.target:
                reached_s = time.monotonic() - started
                break
            time.sleep(0.25)
        sampler.stop.set()
        wall = time.monotonic() - started
    steps = read_steps(cfg.run.run_dir)
    hist: dict[str, int] = {}
    for s in steps:
        for k, v in s["staleness_hist"].items():
            hist[k] = hist.get(k, 0) + v
    pushes = [s["push_s"] for s in steps if s.get("push_s") == s.get("push_s")]
    return {
        "env": env, "eta": eta, "seed": seed, "seconds_to_target": reached_s,
        "final_success": rolling_success(steps, cfg.run.rolling_episodes) if steps else 0.0,
        "episodes": sum(s["episodes"] for s in steps), "tokens": sum(s["tokens"] for s in steps),
        "learner_busy": sum(s["step_s"] for s in steps) / wall, "generation_busy": sampler.fraction,
        "staleness": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))),
        "push_s_mean": statistics.mean(pushes) if pushes else None, "steps": len(steps),
    }


def _reset_server(url: str, model_dir: str, weights_dir: Path) -> None:
    """Serve the initial weights as version 0 before a run starts: the shared server still holds the
    previous run's policy and version label, and actors start sampling before the new learner is up."""
    import asyncio

    import torch
    from transformers import AutoModelForCausalLM

    from learner.weight_sync import DiskWeightSync

    state = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    sync = DiskWeightSync([url], weights_dir, model_dir)
    asyncio.run(sync.push(sync.save(state, 0), 0))


def main(argv: list[str]) -> int:
    args = _parse(argv)
    from turnstream.config import Config, VllmSection
    from turnstream.launcher import ensure_model
    from turnstream.processes import ProcessGroup
    from turnstream.vllm_server import start_vllm_server

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = Config()
    cfg.model.path = args.model
    ensure_model(cfg)
    procs = ProcessGroup(out)
    results = []
    try:
        url = start_vllm_server(procs, str(Path(args.model).resolve()), VllmSection(), name="vllm-bench")
        for env_name in args.envs.split(","):
            for eta in (int(e) for e in args.etas.split(",")):
                for seed in (int(s) for s in args.seeds.split(",")):
                    r = run_one(env_name, eta, seed, url, args)
                    results.append(r)
                    print(json.dumps(r), flush=True)
                    with (out / "results.jsonl").open("a") as f:
                        f.write(json.dumps(r) + "\n")
    finally:
        procs.stop_all()
    summary = summarize(results, args.time_limit)
    print(json.dumps(summary), flush=True)
    return 0


def summarize(results: list[dict], time_limit: float) -> dict:
    """Median over seeds per (env, eta); unreached targets count as the time limit (a lower bound)."""
    def secs(r):
        return r["seconds_to_target"] if r["seconds_to_target"] is not None else time_limit

    table = {}
    print(f"{'env':24} {'eta':>3} {'to target s (median)':>21} {'reached':>8} {'final':>6} {'episodes':>9} "
          f"{'learner busy':>12} {'gen busy':>9} {'push s':>7}")
    for env in dict.fromkeys(r["env"] for r in results):
        for eta in sorted({r["eta"] for r in results if r["env"] == env}):
            rs = [r for r in results if r["env"] == env and r["eta"] == eta]
            med = statistics.median(secs(r) for r in rs)
            table[(env, eta)] = med
            print(f"{env:24} {eta:>3} {med:>21.1f} {sum(r['seconds_to_target'] is not None for r in rs):>5}/{len(rs):<2} "
                  f"{statistics.mean(r['final_success'] for r in rs):>6.2f} "
                  f"{statistics.mean(r['episodes'] for r in rs):>9.0f} "
                  f"{statistics.mean(r['learner_busy'] for r in rs):>12.2f} "
                  f"{statistics.mean(r['generation_busy'] for r in rs):>9.2f} "
                  f"{statistics.mean(r['push_s_mean'] or 0 for r in rs):>7.3f}")
    per_env = {}
    for env in dict.fromkeys(r["env"] for r in results):
        sync = table.get((env, 0))
        asyncs = {eta: t for (e, eta), t in table.items() if e == env and eta > 0}
        if sync is None or not asyncs:
            continue
        best_eta = min(asyncs, key=asyncs.get)
        per_env[env] = {"sync_s": sync, "async_s": asyncs[best_eta], "best_eta": best_eta,
                        "speedup": sync / asyncs[best_eta]}
    first = next(iter(per_env.values()), {"sync_s": None, "async_s": None, "speedup": None})
    return {"speedup": first["speedup"], "sync_s": first["sync_s"], "async_s": first["async_s"], "per_env": per_env}
