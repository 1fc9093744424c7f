"""`turnstream bench actors`: generated tokens/s through a real actor process against a bare async client.

Same vLLM server, same prompt, same sampling parameters and the same number of concurrent requests, in the
same run. The actor plays the `trivial` environment (one free-text turn per episode) and streams every
chunk to a real buffer process; the baseline is K asyncio loops posting /inference/v1/generate and
counting tokens, nothing else. The actor first runs `--warmup` seconds unmeasured (its episode slots,
credits and connections ramp up; the server's prefix cache fills), then phases alternate (baseline, actor,
baseline, actor, ...) so drift in the machine's load hits both sides; the actor is frozen with SIGSTOP
while the baseline runs.
Prints a line per phase and, last, one JSON line: `ratio` = the median over rounds of actor tokens/s /
baseline tokens/s within the round (the paired estimate: the server's own throughput drifts by tens of
percent between rounds on a shared machine), and `ratio_of_means` for reference.

`--pin` gives the vLLM server CPU 0 alone and puts the actor, the buffer and the baseline client on CPU 1,
as in production, where the inference server's accelerator does not share cores with actors. Unpinned, on
a 2-core machine, the actor and buffer processes take CPU from the CPU-bound server while the bare client
has no buffer to feed, so the ratio also measures that contention.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import sys
import time
import urllib.request
from pathlib import Path


def parse_args(argv):
    p = argparse.ArgumentParser(prog="turnstream bench actors")
    p.add_argument("--url", default="", help="an existing vLLM server (default: start one)")
    p.add_argument("--model", default="runs/tiny-model")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--window", type=float, default=8.0, help="seconds measured per phase")
    p.add_argument("--settle", type=float, default=5.0,
                   help="seconds each phase runs before its window (longer than one reply takes to generate)")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--warmup", type=float, default=10.0, help="seconds the actor runs before the first round")
    p.add_argument("--out", default="runs/bench-actors")
    p.add_argument("--pin", action="store_true", help="vLLM on CPU 0; actor, buffer and baseline on CPU 1")
    return p.parse_args(argv)


def _scrape(url: str, *names: str) -> list[float]:
    """The named unlabelled samples, from one fetch of the page."""
    lines = urllib.request.urlopen(url, timeout=5).read().decode().splitlines()
    return [sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name + " ")) for name in names]


async def _baseline(url: str, prompt: list[int], concurrency: int, max_tokens: int, window: float,
                    settle: float) -> float:
    """Tokens/s of the requests that finish within `window` seconds after `settle` seconds of the same load: the
    requests all start together, and their first replies (a model whose replies take longer than the window to
    generate finishes none of them inside it) would measure the ramp, not the steady state the actor is read in."""
    import aiohttp

    body = {"token_ids": prompt, "sampling_params": {"max_tokens": max_tokens, "temperature": 1.0, "logprobs": 0}}
    tokens = 0
    count_from = time.monotonic() + settle
    stop_at = count_from + window

    async def loop(session):
        nonlocal tokens
        while time.monotonic() < stop_at:
            async with session.post(f"{url}/inference/v1/generate", json=body) as resp:
                out = await resp.json()
            if count_from <= time.monotonic() < stop_at:
                tokens += len(out["choices"][0]["token_ids"])

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(loop(session) for _ in range(concurrency)))
    return tokens / window


TOKENS, CREDIT_WAIT = "turnstream_actor_generated_tokens_total", "turnstream_actor_credit_wait_seconds_total"


def _measure_actor(metrics_url: str, window: float) -> tuple[float, float]:
    """Generated tokens/s over `window`, and the share of that time the actor waited for a credit to start an
    episode."""
    t0, (tokens0, waited0) = time.monotonic(), _scrape(metrics_url, TOKENS, CREDIT_WAIT)
    time.sleep(window)
    (tokens, waited), elapsed = _scrape(metrics_url, TOKENS, CREDIT_WAIT), time.monotonic() - t0
    return (tokens - tokens0) / elapsed, (waited - waited0) / elapsed


def actor_bench_config(out: Path, model: str, url: str, *, concurrency: int, max_tokens: int, pin: bool):
    """The config of one actor and a buffer on free ports with `url`'s server and no learner (whose admission room is
    made so large that credits never limit the actor), under `out`; `pin`: both on CPU 1 (the server on CPU 0)."""
    from turnstream.core.config import Config
    from turnstream.launch.processes import free_port

    cfg = Config()
    cfg.run.run_dir = str(out)
    cfg.model.path = model
    cfg.vllm.urls = [url]
    cfg.actor.concurrent_episodes = concurrency
    cfg.actor.max_new_tokens = max_tokens
    # admission must never be what limits throughput here: no learner runs, so make B huge
    cfg.buffer.batch_episodes = cfg.buffer.max_items = cfg.buffer.max_running = 10**6
    cfg.buffer.wal_fsync = "interval"  # the buffer's durability is not what these benches measure
    cfg.buffer.wal_dir = str(out / "buffer-wal")
    cfg.network.buffer_ingest_port = free_port()
    cfg.network.buffer_serve_port = free_port()
    cfg.network.learner_pub_port = free_port()
    cfg.buffer.metrics_port = free_port()
    cfg.actor.metrics_port = free_port()
    if pin:
        cfg.actor.cpus = cfg.buffer.cpus = [1]
    return cfg


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from turnstream.actors.inference.chat_tokens import ChatTokens
    from turnstream.checks.preflight import ensure_model
    from turnstream.core.config import VllmSection
    from turnstream.launch.processes import ProcessGroup, tail
    from turnstream.launch.vllm_server import start_vllm_server

    ensure_model(args.model)  # the actor reads its tokenizer even when --url names a running server
    out = Path(args.out)
    shutil.rmtree(out / "buffer-wal", ignore_errors=True)  # a replayed log from an earlier run is not this run
    out.mkdir(parents=True, exist_ok=True)
    procs = ProcessGroup(out)
    try:
        url = args.url.rstrip("/")
        if not url:
            url = start_vllm_server(procs, args.model, VllmSection(max_num_seqs=256, cpus=[0] if args.pin else []))
        if args.pin:
            os.sched_setaffinity(0, {1})  # the baseline client runs in this process
        cfg = actor_bench_config(out, args.model, url, concurrency=args.concurrency, max_tokens=args.max_tokens,
                                 pin=args.pin)
        cfg.env.name, cfg.env.args = "trivial", {"max_action_tokens": args.max_tokens}
        cfg.buffer.max_staleness = 4
        cfg.buffer.actor_timeout_s = 120.0  # the actor is frozen during baseline phases; it has not left
        cfg_path = out / "bench.toml"
        cfg_path.write_text(cfg.dumps())
        role = [sys.executable, "-m", "turnstream.cli"]
        procs.start("buffer", [*role, "buffer", "--config", str(cfg_path)])
        actor = procs.start("actor", [*role, "actor", "--config", str(cfg_path), "--index", "0"])
        metrics_url = f"http://127.0.0.1:{cfg.actor.metrics_port}/metrics"
        deadline = time.monotonic() + 120
        while True:  # wait until the actor generates
            try:
                if _scrape(metrics_url, TOKENS)[0] > 0:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or actor.proc.poll() is not None:
                print(tail(actor.log_path, 30), file=sys.stderr)
                raise RuntimeError("actor did not start generating")
            time.sleep(0.5)
        prompt = ChatTokens(args.model).first_turn("say something")
        time.sleep(args.warmup)
        base, act = [], []
        for r in range(args.rounds):
            os.kill(actor.proc.pid, signal.SIGSTOP)  # freeze the actor: the server is the baseline's alone
            time.sleep(1.0)  # let the actor's requests in flight drain
            base.append(asyncio.run(_baseline(url, prompt, args.concurrency, args.max_tokens, args.window,
                                              args.settle)))
            os.kill(actor.proc.pid, signal.SIGCONT)
            time.sleep(args.settle)  # credits and the request pipeline refill; timers that ran during the stop fire
            rate, waiting = _measure_actor(metrics_url, args.window)
            act.append(rate)
            print(f"round {r}: baseline {base[-1]:.0f} tokens/s, actor {rate:.0f} tokens/s "
                  f"(waited {waiting:.1%} of the time for a credit)", file=sys.stderr)
        (chunks,) = _scrape(metrics_url, "turnstream_actor_chunks_sent_total")
    finally:
        procs.stop_all()
    b, a = sum(base) / len(base), sum(act) / len(act)
    paired = statistics.median(x / y for x, y in zip(act, base))
    print(json.dumps({"ratio": round(paired, 3), "ratio_of_means": round(a / b, 3),
                      "actor_tokens_per_s": round(a, 1), "baseline_tokens_per_s": round(b, 1),
                      "concurrency": args.concurrency, "max_tokens": args.max_tokens, "window_s": args.window,
                      "rounds": args.rounds, "warmup_s": args.warmup, "pinned": args.pin,
                      "chunks_streamed": int(chunks),
                      "actor_per_round": [round(x, 1) for x in act],
                      "baseline_per_round": [round(x, 1) for x in base]}))
    return 0
