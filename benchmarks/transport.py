"""`turnstream bench transport`: the ceiling in turns per second of each way an actor could reach vLLM.

Every route gets the same model (`--model`, the tiny one by default), the same prompts (every turn's context of
every sign sequence of the demo's task, follow_signs at junctions 2, 3 and 4, rendered with the model's chat
template as the actor renders them), the same sampling parameters (temperature 1, max_tokens 1, the log-prob of
the sampled token) and the same number of turns in flight (`--concurrency`), kept full by the bench process,
which is the client of every route. Each route runs `--warmup` seconds unmeasured, then `--rounds` windows of
`--window` seconds; its figure is the median of its windows' turns per second. A turn counts only when its reply
holds the sampled token and its log-prob.

The routes:

- `http` (a), today's: one POST /inference/v1/generate per turn, sent and read by the actor's own client
  (`post_generate`: aiohttp, JSON, the reply checked and turned into tokens, log-probs and per-token weight
  versions) to vLLM's OpenAI API server started as the launcher starts it (`vllm_command`). It includes the
  client's JSON, HTTP/1.1 keep-alive over loopback TCP, uvicorn and FastAPI with vLLM's middleware (CORS, the
  Prometheus instrumentation of every request), the request's pydantic validation and rendering, the engine
  client's hop to the engine core process, the engine step, detokenization, and the reply's JSON.
- `http_batched` (b): vLLM 0.32's /inference/v1/generate takes one prompt per request (its `token_ids` is a list of
  ints), so this is the closest form the server offers: POST /v1/completions whose `prompt` is a list of
  `--batch` token-id prompts, one engine request each, with concurrency / batch messages in flight, on the same
  server as (a). Completions carry no weight versions (only /inference/v1/generate stamps them), so the actor
  could not use it as it is: it is the HTTP stack's ceiling when its cost is shared by many turns.
- `engine_zmq` (c): `benchmarks/transport_engine.py`, a process that builds vLLM's `AsyncLLM` as the API server
  builds it (the same arguments, so the same engine core and statistics) and answers a ZeroMQ ROUTER socket, one
  msgpack map a request (prompt token ids, sampling parameters) and a reply (token ids, log-probs, weight version
  spans); the client is a DEALER socket. It includes msgpack both ways, ZeroMQ over loopback TCP, the engine
  client's input processing, its hop to the engine core, the engine step and detokenization; no HTTP, no JSON.
- `http_quiet` (d): route (a)'s client against a server without the Prometheus instrumentation of each HTTP
  request (`benchmarks/transport_quiet_server.py`; no flag of vLLM's turns it off) and with `--disable-log-stats`
  (no per-step statistics in the engine and its client, no `vllm:*` metrics, no periodic log line).
- `http_tokens_only` (d): as `http_quiet`, plus `--tokens-only`: no tokenizer in the server, so no
  detokenization of sampled tokens (what needs text, such as vLLM's own chat template, cannot be served).
  vLLM's other per-request settings are already at their cheapest in (a): no request log (`--enable-log-requests`
  is off by default), no access log (`--disable-uvicorn-access-log`), no load tracking.

The routes that share a server are measured on one start of it; each server is started in a process group of its
own under `--out` and stopped by its PID before the next starts, so one server at a time holds the machine. With
`--cycles N` the whole sequence runs N times and each route's median is over all its windows, which spreads a
machine's drift over the routes. `--pin` gives the servers CPU 0 and the client CPU 1. Prints a line per route,
then one JSON line: each route's turns/s and its ratio to `http`.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.transport_engine import MalformedMessage, SampleReply, SampleRequest, SamplingSpec

BASELINE = "http"
SAMPLING = SamplingSpec(max_tokens=1, temperature=1.0, logprobs=0)
DEMO_JUNCTIONS = [2, 3, 4]  # configs/demo.toml's follow_signs
REPLY = "L"  # every turn's reply in the prompts: what is sampled next does not depend on it
CHECKOUT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
FIRST_ANSWER_TIMEOUT_S = 60.0


def parse_args(argv):
    p = argparse.ArgumentParser(prog="turnstream bench transport")
    p.add_argument("--model", default="runs/tiny-model")
    p.add_argument("--routes", default=",".join(ROUTES),
                   help="comma-separated routes to measure (the module's docstring says what each is)")
    p.add_argument("--concurrency", type=int, default=64, help="turns in flight, on every route")
    p.add_argument("--batch", type=int, default=16, help="prompts per message of http_batched")
    p.add_argument("--window", type=float, default=5.0, help="seconds per measured window")
    p.add_argument("--rounds", type=int, default=5, help="windows per route and cycle")
    p.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds before a route's first window")
    p.add_argument("--cycles", type=int, default=1, help="times the whole sequence of servers runs")
    p.add_argument("--pin", action="store_true", help="servers on CPU 0, the client on CPU 1")
    p.add_argument("--start-timeout", type=float, default=300.0, help="seconds a server may take to answer")
    p.add_argument("--out", default="runs/bench-transport")
    args = p.parse_args(argv)
    unknown = [name for name in args.routes.split(",") if name not in ROUTES]
    if unknown:
        p.error(f"--routes: unknown {unknown}; known: {sorted(ROUTES)}")
    if args.concurrency < 1 or args.batch < 1 or args.rounds < 1 or args.cycles < 1 or args.window <= 0:
        p.error("--concurrency, --batch, --rounds and --cycles must be at least 1 and --window above 0")
    return args


async def demo_turns(chat, junctions: list[int]) -> list[list[int]]:
    """Every turn's context, as the actor sends it, of every follow_signs episode at `junctions` (one per sign
    sequence), each turn answered with REPLY. `chat`: ChatTokens' first_turn, next_turn and encode."""
    from turnstream.actors.envs.tasks.follow_signs import FollowSigns

    env = FollowSigns(junctions)
    reply = chat.encode(REPLY)
    turns = []
    for task in range(env.num_tasks):
        context = chat.first_turn((await env.reset(seed=task, task=task)).observation)
        while True:
            turns.append(context)
            step = await env.step(REPLY)
            if step.done:
                break
            context = context + reply + chat.next_turn(step.observation, reply)
    return turns


def window_rates(marks: list[tuple[float, int]]) -> list[float]:
    """Turns per second of each window between consecutive (time, turns answered so far) marks."""
    return [(n1 - n0) / (t1 - t0) for (t0, n0), (t1, n1) in zip(marks, marks[1:])]


def summarise(windows: dict[str, list[float]], baseline: str) -> dict:
    """Each route's median over its windows, and its ratio to the baseline route's (None without it)."""
    medians = {name: statistics.median(rates) for name, rates in windows.items()}
    base = medians.get(baseline)
    return {"turns_per_s": {name: round(m, 1) for name, m in medians.items()},
            f"ratio_to_{baseline}": {name: round(m / base, 3) if base else None for name, m in medians.items()}}


class Route(ABC):
    """A client of one route: `call` sends a message of `prompts_per_call` turns and returns how many came back
    whole (a token and its log-prob each); a failed message counts in `errors` and returns 0."""
    prompts_per_call = 1

    def __init__(self, address: str):
        self.address = address
        self.errors = 0

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        pass

    @abstractmethod
    async def call(self, prompts: list[list[int]]) -> int:
        ...


class HttpRoute(Route):
    """A route over one aiohttp session, set up as the actor's fleet sets up its own."""

    async def open(self) -> None:
        import aiohttp

        from turnstream.protocol.http_links import silent_peer_connector

        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60),
                                             connector=silent_peer_connector(limit=0, keepalive_timeout=3.0))

    async def close(self) -> None:
        await self.session.close()


class GeneratePosts(HttpRoute):
    """(a), (d): one POST /inference/v1/generate a turn, through the actor's client."""

    async def call(self, prompts: list[list[int]]) -> int:
        from turnstream.actors.inference.client import InferenceError, post_generate

        try:
            gen = await post_generate(self.session, self.address, prompts[0], max_tokens=SAMPLING.max_tokens,
                                      temperature=SAMPLING.temperature)
        except InferenceError:
            self.errors += 1
            return 0
        return 1 if gen.tokens else 0


class CompletionsBatches(HttpRoute):
    """(b): one POST /v1/completions of `batch` token-id prompts."""

    def __init__(self, address: str, batch: int):
        super().__init__(address)
        self.prompts_per_call = batch

    async def call(self, prompts: list[list[int]]) -> int:
        import aiohttp

        body = {"model": "policy", "prompt": prompts, "max_tokens": SAMPLING.max_tokens,
                "temperature": SAMPLING.temperature, "logprobs": SAMPLING.logprobs, "return_token_ids": True}
        try:
            async with self.session.post(f"{self.address}/v1/completions", json=body) as resp:
                if resp.status != 200:
                    self.errors += 1
                    return 0
                choices = (await resp.json())["choices"]
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError):
            self.errors += 1
            return 0
        return sum(1 for c in choices
                   if c.get("token_ids") and len((c.get("logprobs") or {}).get("token_logprobs") or ())
                   == len(c["token_ids"]))


class EngineRequests(Route):
    """(c): one msgpack request a turn on a DEALER socket; replies are matched to requests by id."""

    async def open(self) -> None:
        import zmq
        import zmq.asyncio

        self.context = zmq.asyncio.Context()
        self.sock = self.context.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(self.address)
        self.waiting: dict[int, asyncio.Future] = {}
        self.ids = itertools.count()
        self.receiver = asyncio.create_task(self.receive())

    async def receive(self) -> None:
        while True:
            frame = await self.sock.recv()
            try:
                reply = SampleReply.decode(frame)
            except MalformedMessage:
                self.errors += 1
                continue
            waiter = self.waiting.pop(reply.id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(reply)

    async def call(self, prompts: list[list[int]]) -> int:
        request = SampleRequest(next(self.ids), prompts[0], SAMPLING)
        waiter = self.waiting[request.id] = asyncio.get_running_loop().create_future()
        await self.sock.send(request.encode())
        reply = await waiter
        if reply.error or not reply.token_ids:
            self.errors += 1
            return 0
        return 1

    async def close(self) -> None:
        self.receiver.cancel()
        self.sock.close()
        self.context.term()


class Backend(ABC):
    """A process the bench starts for some routes, run as `python -m MODULE ARGS` with the checkout importable."""
    name: str

    def start(self, procs, vllm_argv: list[str], env: dict, cpus: list[int], timeout_s: float) -> str:
        """Start it under `procs` with vLLM's server arguments `vllm_argv` and return the address its routes send
        to, once it answers; when it does not, its last log lines go to stderr, the only clue to why."""
        from turnstream.launch.processes import free_port, tail

        port = free_port(HOST)
        paths = os.pathsep.join(p for p in (str(CHECKOUT), os.environ.get("PYTHONPATH", "")) if p)
        child = procs.start(self.name, [sys.executable, "-m", *self.command(port, vllm_argv)],
                            {**env, "PYTHONPATH": paths}, cpus)
        address = self.address(port)
        if not self.answers(address, timeout_s, alive=lambda: child.proc.poll() is None):
            print(tail(child.log_path, 30), file=sys.stderr)
            raise RuntimeError(f"{self.name} at {address} did not answer within {timeout_s:.0f} s")
        return address

    @abstractmethod
    def command(self, port: int, vllm_argv: list[str]) -> list[str]:
        """The module to run and its arguments."""

    @abstractmethod
    def address(self, port: int) -> str:
        ...

    @abstractmethod
    def answers(self, address: str, timeout_s: float, alive: Callable[[], bool]) -> bool:
        """Whether it answers before `timeout_s`, while `alive()`."""


@dataclass(frozen=True)
class HttpServer(Backend):
    """vLLM's OpenAI API server, run as `module` with the launcher's arguments and `extra_args`."""
    name: str
    module: str
    extra_args: tuple[str, ...] = ()

    def command(self, port, vllm_argv):
        return [self.module, *vllm_argv, "--port", str(port), *self.extra_args]

    def address(self, port):
        return f"http://{HOST}:{port}"

    def answers(self, address, timeout_s, alive):
        from turnstream.launch.vllm_server import wait_healthy

        try:
            wait_healthy(address, timeout_s, alive)
        except (RuntimeError, TimeoutError):
            return False
        return True


@dataclass(frozen=True)
class EngineFront(Backend):
    """benchmarks/transport_engine.py: AsyncLLM behind a ROUTER socket, built from the launcher's arguments."""
    name: str = "engine-front"

    def command(self, port, vllm_argv):
        return ["benchmarks.transport_engine", "--bind", self.address(port), "--", *vllm_argv]

    def address(self, port):
        return f"tcp://{HOST}:{port}"

    def answers(self, address, timeout_s, alive):
        return answers_a_request(address, timeout_s, alive)


def answers_a_request(address: str, timeout_s: float, alive: Callable[[], bool]) -> bool:
    """Whether a one-token request to the engine front at `address` is answered before `timeout_s`, while
    `alive()`: its socket is bound only once the engine is up, and a connected DEALER queues the request."""
    import zmq

    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(address)
        sock.send(SampleRequest(0, [1], SAMPLING).encode())
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and alive():
            if sock.poll(500):
                return not SampleReply.decode(sock.recv()).error
        return False
    finally:
        sock.close()
        context.term()


@dataclass(frozen=True)
class RouteSpec:
    backend: Backend
    client: Callable[[str, argparse.Namespace], Route]


API_SERVER = HttpServer("vllm", "vllm.entrypoints.openai.api_server")
QUIET = HttpServer("vllm-quiet", "benchmarks.transport_quiet_server", ("--disable-log-stats",))
TOKENS_ONLY = HttpServer("vllm-tokens-only", "benchmarks.transport_quiet_server",
                         ("--disable-log-stats", "--tokens-only"))
ROUTES = {
    "http": RouteSpec(API_SERVER, lambda address, args: GeneratePosts(address)),
    "http_batched": RouteSpec(API_SERVER, lambda address, args: CompletionsBatches(address, args.batch)),
    "engine_zmq": RouteSpec(EngineFront(), lambda address, args: EngineRequests(address)),
    "http_quiet": RouteSpec(QUIET, lambda address, args: GeneratePosts(address)),
    "http_tokens_only": RouteSpec(TOKENS_ONLY, lambda address, args: GeneratePosts(address)),
}


async def measure(route: Route, turns: list[list[int]], concurrency: int, warmup: float, window: float,
                  rounds: int) -> list[tuple[float, int]]:
    """(time, turns answered so far) at the start and at the end of each of `rounds` windows (window_rates makes
    them turns/s), with `concurrency` turns in flight from the first call to the last; the warm-up starts at the
    first answer."""
    await route.open()
    calls = max(1, concurrency // route.prompts_per_call)
    answered, running = 0, True

    async def slot(first: int) -> None:
        nonlocal answered
        for start in itertools.count(first, calls * route.prompts_per_call):
            if not running:
                return
            batch = [turns[(start + j) % len(turns)] for j in range(route.prompts_per_call)]
            done = await route.call(batch)  # read `answered` only after the await: other slots add meanwhile
            answered += done

    slots = [asyncio.create_task(slot(i * route.prompts_per_call)) for i in range(calls)]
    try:
        # a server's first requests can take seconds (lazy set-up), which a fixed warm-up may not cover
        deadline = time.monotonic() + FIRST_ANSWER_TIMEOUT_S
        while answered == 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no turn answered in {FIRST_ANSWER_TIMEOUT_S:.0f} s "
                                   f"({route.errors} failed messages)")
            await asyncio.sleep(0.05)
        await asyncio.sleep(warmup)
        marks = [(time.monotonic(), answered)]
        for _ in range(rounds):
            await asyncio.sleep(window)
            marks.append((time.monotonic(), answered))
        running = False
        await asyncio.gather(*slots)
    finally:
        for task in slots:
            task.cancel()
        await route.close()
    return marks


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from turnstream.actors.inference.chat_tokens import ChatTokens
    from turnstream.checks.preflight import ensure_model
    from turnstream.core.config import VllmSection
    from turnstream.launch.processes import ProcessGroup
    from turnstream.launch.vllm_server import vllm_command

    ensure_model(args.model)
    turns = asyncio.run(demo_turns(ChatTokens(args.model), DEMO_JUNCTIONS))
    cfg = VllmSection(max_num_seqs=256, cpus=[0] if args.pin else [])
    launcher_argv, env = vllm_command(args.model, HOST, 0, cfg)
    # the launcher's arguments less its interpreter, module and port, which each backend sets
    vllm_argv = launcher_argv[3:]
    at = vllm_argv.index("--port")
    del vllm_argv[at:at + 2]
    if args.pin:
        os.sched_setaffinity(0, {1})  # the client runs in this process
    chosen = args.routes.split(",")
    backends = list(dict.fromkeys(ROUTES[name].backend for name in chosen))  # in the order first named
    windows: dict[str, list[float]] = {name: [] for name in chosen}
    errors = dict.fromkeys(chosen, 0)
    out = Path(args.out)
    for cycle, backend in itertools.product(range(args.cycles), backends):
        procs = ProcessGroup(out / backend.name)
        try:
            started = time.monotonic()
            address = backend.start(procs, vllm_argv, env, cfg.cpus, args.start_timeout)
            print(f"cycle {cycle}: {backend.name} answering after {time.monotonic() - started:.1f} s",
                  file=sys.stderr)
            for name in (n for n in chosen if ROUTES[n].backend == backend):
                route = ROUTES[name].client(address, args)
                marks = asyncio.run(measure(route, turns, args.concurrency, args.warmup, args.window, args.rounds))
                rates = window_rates(marks)
                windows[name] += rates
                errors[name] += route.errors
                print(f"cycle {cycle}: {name}: {statistics.median(rates):.0f} turns/s (windows "
                      f"{min(rates):.0f}-{max(rates):.0f}, {route.errors} failed messages)", file=sys.stderr)
        finally:
            procs.stop_all()
    result = summarise(windows, BASELINE)
    for name in chosen:
        ratio = result[f"ratio_to_{BASELINE}"][name]
        print(f"{name}: {result['turns_per_s'][name]:.1f} turns/s" + (f", {ratio:.3f} of {BASELINE}" if ratio else ""))
    print(json.dumps({**result, "windows": {n: [round(r, 1) for r in w] for n, w in windows.items()},
                      "failed_messages": errors, "concurrency": args.concurrency, "batch": args.batch,
                      "window_s": args.window, "rounds": args.rounds, "warmup_s": args.warmup,
                      "cycles": args.cycles, "pinned": args.pin, "distinct_prompts": len(turns),
                      "model": args.model}))
    return 0
