"""`turnstream bench envs`: actor throughput with environments that misbehave, isolation on and off.

One vLLM server (the tiny model by default) serves every phase; each phase starts a fresh buffer and one actor
process playing one environment with `env.isolation` "loop" or "process", lets it run `--warmup` seconds, then
reads the actor's /metrics over `--window` seconds: turns/s and generated tokens/s, the episodes in flight and
those waiting on their environment, and, over the whole phase, the episodes by outcome, the environment errors
by kind (the reasons episodes were abandoned) and the worker processes replaced. It watches the actor's
process throughout: whether it died is part of the result.

The environments are the probes of actors/envs/probes/misbehaving.py, each `trivial` (`--turns` free-text turns,
reward 0) plus one fault, and `trivial` itself as the well-behaved one:
    well       trivial
    hang       one step in 50 never returns (until env.step_timeout_s, `--step-timeout`, abandons it)
    block      every step holds its thread for 50 ms in time.sleep
    crash      one episode in 100 segfaults its process at its first step
    slow_tool  every step awaits a tool call: 0.5 s, and one in ten 5 s
Each is played with isolation "loop" and "process". The crashing environment on "loop" kills the actor: that
phase is played, and shows it (the actor died; isolation is what keeps it up), and it is not held to the
no-death target. `slow_tool` is also played with the episodes in flight fixed at K (actor.max_episodes_in_flight
= actor.concurrent_episodes) to show what adapting them gains. Per isolation the well-behaved phase is played
before and after the others and their mean is the reference, so slow drift in the machine's load is shared;
`--rounds` plays everything again, and a ratio is the median over rounds.

No learner runs: the buffer's admission room is made huge (batch size, memory, running episodes) so that
credits never limit the actor; what is measured is the actor and its environments.

Prints a line per phase and a table, then one JSON line: per phase its figures, and the ratios and targets
(`block_process` >= 0.8 of the well-behaved phase with isolation on; `slow_tool` >= 0.8 of the well-behaved one
on the same loop, whose steps are instant; no actor death except the crashing environment on "loop").
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

ENVIRONMENTS = {  # label -> (registered name, the fault's args)
    "well": ("trivial", {}),
    "hang": ("probe_hang", {"every": 50}),
    "block": ("probe_block", {"block_s": 0.05}),
    "crash": ("probe_crash", {"every": 100}),
    "slow_tool": ("probe_slow_tool", {"median_s": 0.5, "tail_every": 10, "tail_factor": 10.0}),
}
TARGET = 0.8
TURNS, TOKENS = "turnstream_actor_turns_total", "turnstream_actor_generated_tokens_total"
IN_FLIGHT, WAITING = "turnstream_actor_running_episodes", "turnstream_actor_episodes_waiting_on_env"


@dataclass(frozen=True)
class Phase:
    env: str  # a key of ENVIRONMENTS
    isolation: str  # "loop" or "process"
    fixed_in_flight: bool = False  # actor.max_episodes_in_flight = concurrent_episodes

    @property
    def name(self) -> str:
        return f"{self.env}/{self.isolation}" + ("/fixed-k" if self.fixed_in_flight else "")


@dataclass
class PhaseResult:
    name: str
    actor_died: bool
    round: int = 0
    turns_per_s: float | None = None  # None: the actor died before the window ended
    tokens_per_s: float | None = None
    mean_in_flight: float | None = None
    mean_waiting_on_env: float | None = None
    outcomes: dict[str, float] = field(default_factory=dict)  # episodes by outcome, whole phase
    env_errors: dict[str, float] = field(default_factory=dict)  # abandoned episodes by kind, whole phase
    worker_restarts: dict[str, float] = field(default_factory=dict)
    loop_blocked_s: float = 0.0
    exit_code: int | None = None


def parse_args(argv):
    p = argparse.ArgumentParser(prog="turnstream bench envs", description=__doc__.splitlines()[0])
    p.add_argument("--url", default="", help="an existing vLLM server (default: start one)")
    p.add_argument("--model", default="runs/tiny-model")
    p.add_argument("--concurrency", type=int, default=64, help="actor.concurrent_episodes (K)")
    p.add_argument("--turns", type=int, default=4, help="turns per episode, every environment")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--warmup", type=float, default=8.0, help="seconds each phase runs before its window")
    p.add_argument("--window", type=float, default=15.0, help="seconds measured per phase")
    p.add_argument("--rounds", type=int, default=1, help="times every phase is played; ratios: median over rounds")
    p.add_argument("--step-timeout", type=float, default=10.0, help="env.step_timeout_s (the hangs' end)")
    p.add_argument("--envs", default=",".join(ENVIRONMENTS), help="which of " + ",".join(ENVIRONMENTS))
    p.add_argument("--out", default="runs/bench-envs")
    p.add_argument("--pin", action="store_true", help="vLLM on CPU 0; actor, its workers and buffer on CPU 1")
    return p.parse_args(argv)


def phases(envs: list[str]) -> list[Phase]:
    """One round: per isolation, the well-behaved phase, every other environment, the well-behaved phase again;
    slow_tool on the loop also with the episodes in flight fixed at K."""
    out: list[Phase] = []
    for isolation in ("loop", "process"):
        others = [Phase(env, isolation) for env in envs if env != "well"]
        if isolation == "loop" and "slow_tool" in envs:
            others.append(Phase("slow_tool", "loop", fixed_in_flight=True))
        out += [Phase("well", isolation), *others, Phase("well", isolation)]
    return out


def _samples(metrics_url: str) -> list:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def _total(samples, name: str) -> float:
    return sum(s.value for s in samples if s.name == name)


def _by_label(samples, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in samples:
        if s.name == name and s.value:
            out[s.labels[label]] = out.get(s.labels[label], 0.0) + s.value
    return out


def _config(phase: Phase, url: str, out: Path, args):
    from benchmarks.actors import actor_bench_config

    cfg = actor_bench_config(out, args.model, url, concurrency=args.concurrency, max_tokens=args.max_tokens,
                             pin=args.pin)
    name, fault = ENVIRONMENTS[phase.env]
    cfg.env.name, cfg.env.args = name, {"turns": args.turns, "max_action_tokens": args.max_tokens, **fault}
    cfg.env.isolation = phase.isolation
    cfg.env.step_timeout_s = args.step_timeout
    if phase.fixed_in_flight:
        cfg.actor.max_episodes_in_flight = args.concurrency
    return cfg


def run_phase(phase: Phase, url: str, args, round_: int = 0) -> PhaseResult:
    from turnstream.launch.processes import ProcessGroup, tail

    out = Path(args.out) / f"{round_}-{phase.name.replace('/', '-')}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cfg = _config(phase, url, out, args)
    (out / "bench.toml").write_text(cfg.dumps())
    procs = ProcessGroup(out)
    role = [sys.executable, "-m", "turnstream.cli"]
    metrics_url = f"http://127.0.0.1:{cfg.actor.metrics_port}/metrics"
    try:
        procs.start("buffer", [*role, "buffer", "--config", str(out / "bench.toml")], cpus=cfg.buffer.cpus)
        actor = procs.start("actor", [*role, "actor", "--config", str(out / "bench.toml"), "--index", "0"],
                            cpus=cfg.actor.cpus)
        died = lambda: actor.proc.poll() is not None  # noqa: E731
        deadline = time.monotonic() + 120
        while not died():  # until the actor generates
            try:
                if _total(_samples(metrics_url), TOKENS) > 0:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                print(tail(actor.log_path, 30), file=sys.stderr)
                raise RuntimeError(f"{phase.name}: the actor did not start generating")
            time.sleep(0.5)
        last = _watch(died, metrics_url, args.warmup)
        first, t0 = last, time.monotonic()
        gauges: list[tuple[float, float]] = []
        while not died() and time.monotonic() - t0 < args.window:
            time.sleep(1.0)
            last = _snapshot(metrics_url) or last
            gauges.append((_total(last, IN_FLIGHT), _total(last, WAITING)))
        elapsed = time.monotonic() - t0
        result = PhaseResult(phase.name, actor_died=died(), round=round_, exit_code=actor.proc.poll())
        if not result.actor_died and first:
            result.turns_per_s = (_total(last, TURNS) - _total(first, TURNS)) / elapsed
            result.tokens_per_s = (_total(last, TOKENS) - _total(first, TOKENS)) / elapsed
            result.mean_in_flight = statistics.fmean(g[0] for g in gauges)
            result.mean_waiting_on_env = statistics.fmean(g[1] for g in gauges)
        if last:  # what the actor said last: counted up to the end, or up to its death
            result.outcomes = _by_label(last, "turnstream_actor_episodes_total", "outcome")
            result.env_errors = _by_label(last, "turnstream_actor_env_errors_total", "kind")
            result.worker_restarts = _by_label(last, "turnstream_actor_env_worker_restarts_total", "reason")
            result.loop_blocked_s = _total(last, "turnstream_actor_env_loop_blocked_seconds_total")
        return result
    finally:
        procs.stop_all(timeout_s=10.0)


def _snapshot(metrics_url: str) -> list | None:
    try:
        return _samples(metrics_url)
    except OSError:  # the actor is gone (or busy past the timeout): keep what it said last
        return None


def _watch(died, metrics_url: str, seconds: float) -> list | None:
    """Sleep `seconds` in steps, stopping early if the actor dies; its last metrics."""
    last = _snapshot(metrics_url)
    stop_at = time.monotonic() + seconds
    while not died() and time.monotonic() < stop_at:
        time.sleep(min(1.0, max(0.0, stop_at - time.monotonic())))
        last = _snapshot(metrics_url) or last
    return last


def summary(results: list[PhaseResult]) -> dict:
    """Each phase's tokens/s against the mean of the well-behaved phases of its round and isolation (played just
    before and after it), the median over rounds; and the targets."""
    rounds: dict[int, dict[str, list[float]]] = {}
    for r in results:
        rates = rounds.setdefault(r.round, {}).setdefault(r.name, [])
        if r.tokens_per_s is not None:
            rates.append(r.tokens_per_s)
    per_round: dict[str, list[float]] = {}
    for by_name in rounds.values():
        for name, rates in by_name.items():
            reference = by_name.get("well/" + name.split("/")[1])
            if not name.startswith("well/") and rates and reference:
                per_round.setdefault(name, []).append(statistics.fmean(rates) / statistics.fmean(reference))
    names = dict.fromkeys(r.name for r in results if not r.name.startswith("well/"))
    ratios: dict[str, float | None] = {
        name: round(statistics.median(per_round[name]), 3) if name in per_round else None for name in names}
    deaths = sorted({r.name for r in results if r.actor_died})
    unexpected = [name for name in deaths if name != "crash/loop"]
    targets = {
        "block_process_vs_well": {"ratio": ratios.get("block/process"), "target": TARGET},
        "slow_tool_vs_instant": {"ratio": ratios.get("slow_tool/loop"), "target": TARGET},
        "no_actor_death": {"died": unexpected, "target": "none, except crash/loop"},
    }
    met = all(t["ratio"] is not None and t["ratio"] >= TARGET for k, t in targets.items() if "ratio" in t)
    return {"ratios": ratios, "ratios_per_round": {k: [round(x, 3) for x in v] for k, v in per_round.items()},
            "targets": targets, "targets_met": met and not unexpected, "actor_died": deaths}


def format_table(results: list[PhaseResult], ratios: dict) -> str:
    def num(x, fmt="{:.0f}"):
        return "-" if x is None else fmt.format(x)

    lines = [f"{'round/phase':<26} {'turns/s':>8} {'tokens/s':>9} {'ratio':>6} {'in flight':>9} {'waiting':>8}  "
             "died  abandoned by kind / worker restarts"]
    for r in results:
        abandoned = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r.env_errors.items())) or "-"
        restarts = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r.worker_restarts.items()))
        lines.append(f"{f'{r.round} {r.name}':<26} {num(r.turns_per_s, '{:.1f}'):>8} {num(r.tokens_per_s):>9} "
                     f"{num(ratios.get(r.name), '{:.2f}'):>6} {num(r.mean_in_flight):>9} "
                     f"{num(r.mean_waiting_on_env):>8}  {'yes' if r.actor_died else 'no':<4}  {abandoned}"
                     + (f" / {restarts}" if restarts else ""))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from turnstream.checks.preflight import ensure_model
    from turnstream.core.config import VllmSection
    from turnstream.core.configtools import ConfigError
    from turnstream.launch.processes import ProcessGroup
    from turnstream.launch.vllm_server import start_vllm_server

    envs = [e.strip() for e in args.envs.split(",") if e.strip()]
    unknown = [e for e in envs if e not in ENVIRONMENTS]
    if unknown:
        raise ConfigError(f"bench envs: --envs: unknown {', '.join(unknown)}; choose from {', '.join(ENVIRONMENTS)}")
    ensure_model(args.model)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    server = ProcessGroup(out)
    results: list[PhaseResult] = []
    try:
        url = args.url.rstrip("/") or start_vllm_server(server, args.model,
                                                         VllmSection(max_num_seqs=256, cpus=[0] if args.pin else []))
        for round_ in range(args.rounds):
            for phase in phases(envs):
                results.append(r := run_phase(phase, url, args, round_))
                print(f"round {round_} {r.name}: {r.tokens_per_s or 0:.0f} tokens/s, {r.turns_per_s or 0:.1f} "
                      f"turns/s, died {r.actor_died}, abandoned {r.env_errors}", file=sys.stderr)
    finally:
        server.stop_all()
    result = summary(results)
    print(format_table(results, result["ratios"]), file=sys.stderr)
    print(json.dumps({**result, "concurrency": args.concurrency, "turns": args.turns, "max_tokens": args.max_tokens,
                      "window_s": args.window, "warmup_s": args.warmup, "rounds": args.rounds,
                      "step_timeout_s": args.step_timeout,
                      "pinned": args.pin, "phases": [asdict(r) for r in results]}))
    return 0
