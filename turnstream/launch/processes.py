"""Start role processes and stop exactly those, by PID, on exit, Ctrl-C or SIGTERM.

Each child gets its own session (so its whole process group, e.g. vLLM's engine core, is stopped with
it) and PR_SET_PDEATHSIG, so it also goes when the launcher is killed without a chance to clean up.
"""
from __future__ import annotations

import ctypes
import json
import os
import random
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from turnstream.launch.peak_memory import tree_peaks_mib

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass  # not Linux: the launcher's own cleanup still stops the children


def _ephemeral_low() -> int:
    try:
        return int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port_block(host: str = "127.0.0.1", count: int = 1, attempts: int = 400) -> int:
    """First port of `count` consecutive free ports (actor i serves metrics on base + i).

    Ports are drawn below the kernel's ephemeral range: a port chosen here is bound by a role only a few
    seconds later, and in between any outgoing connection or `bind(0)` on the machine (vLLM's start-up
    opens many) could take an ephemeral port. Nothing takes a non-ephemeral port unless it asks for it.
    For the same reason a port this process handed out before is never drawn again: it is still free when
    its role has not bound it yet, and two callers (a buffer's ingest port and the learner's publisher,
    picked one after the other) would then both bind it.
    """
    high = _ephemeral_low()
    low = max(1024, high - 12000)
    rng = random.Random()
    for _ in range(attempts):
        base = rng.randrange(low, high - count)
        block = range(base, base + count)
        if not _HANDED_OUT.isdisjoint(block):
            continue
        socks = []
        try:
            for port in block:  # hold them all at once, so the block is free together
                s = socket.socket()
                socks.append(s)
                s.bind((host, port))
            _HANDED_OUT.update(block)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise OSError(f"no {count} consecutive free ports on {host} after {attempts} attempts")


_HANDED_OUT: set[int] = set()  # ports free_port_block returned in this process


def free_port(host: str = "127.0.0.1") -> int:
    return free_port_block(host, 1)


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log_path: Path
    # how it was started, so that a restart starts the same thing
    argv: list[str] = field(default_factory=list)
    env: dict | None = None
    cpus: list[int] | None = None
    incarnation: int = 1  # 1 for the first start, 2 after its first restart, ...


# A stop stage: which children it stops (by name) and how long they get after SIGTERM before SIGKILL.
StopStage = tuple[Callable[[str], bool], float]


class ProcessGroup:
    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.children: list[Child] = []
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)

    def start(self, name: str, argv: list[str], env: dict | None = None, cpus: list[int] | None = None) -> Child:
        """`cpus`: pin the child (and every process it starts) to these CPU ids; None or empty: anywhere.

        Its log is appended to: a resumed run keeps the logs of the processes before it."""
        child = self._spawn(name, argv, env, cpus, self.run_dir / "logs" / f"{name}.log", "ab")
        self.children.append(child)
        self._write_pids()
        return child

    def restart(self, old: Child, argv: list[str] | None = None) -> Child:
        """Start `old` again under its name (and its argv, unless given), in its place in the group.

        What is left of the old process group (a vLLM engine core, say) is killed first, so that no
        incarnation outlives its successor's start and the old group id is free before it is forgotten. The
        log file goes on: a marker line, then the new incarnation's output."""
        _signal_group(old.proc, signal.SIGKILL)
        old.proc.wait()
        _wait_groups_gone([old], 10.0)
        incarnation = old.incarnation + 1
        with old.log_path.open("ab") as log:
            log.write(f"\n----- restart: incarnation {incarnation} of {old.name} -----\n".encode())
        child = self._spawn(old.name, argv or old.argv, old.env, old.cpus, old.log_path, "ab")
        child.incarnation = incarnation
        self.children[self.children.index(old)] = child
        self._write_pids()
        return child

    def _spawn(self, name: str, argv: list[str], env: dict | None, cpus: list[int] | None, log_path: Path,
               mode: str) -> Child:
        log = log_path.open(mode)

        def setup() -> None:
            _die_with_parent()
            if cpus:
                os.sched_setaffinity(0, cpus)

        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **(env or {})}, start_new_session=True, preexec_fn=setup)
        log.close()
        return Child(name, proc, log_path, list(argv), env, cpus)

    def exited(self) -> list[Child]:
        return [c for c in self.children if c.proc.poll() is not None]

    def stop_all(self, timeout_s: float = 20.0, stages: Sequence[StopStage] = ()) -> dict[str, float | None]:
        """Stop every child, stage by stage: a stage's children get SIGTERM (to their process groups) and its
        timeout to exit, then SIGKILL. Children no stage names go last, newest first, with `timeout_s`.

        Stages give the shutdown an order: what feeds others stops before what it feeds (actors before the
        learner before the buffer and the vLLM servers), so nothing fails for want of a peer stopped first.

        Returns each child's peak memory in MiB over its process tree (peak_memory.py), read just before its
        stage is signalled, so that it covers all the work the child did; None for a child that had exited."""
        peaks: dict[str, float | None] = {}
        left = list(self.children)
        for selects, stage_timeout_s in stages:
            group = [c for c in left if selects(c.name)]
            left = [c for c in left if c not in group]
            peaks.update(_peaks(group))
            _stop(group, stage_timeout_s)
        left.reverse()
        peaks.update(_peaks(left))
        _stop(left, timeout_s)
        # Return only once every group is empty, so nothing started here outlives the caller.
        _wait_groups_gone(self.children, 10.0)
        return {c.name: peaks[c.name] for c in self.children}  # in start order

    def _write_pids(self) -> None:
        pids = {c.name: c.proc.pid for c in self.children}
        (self.run_dir / "pids.json").write_text(json.dumps(pids, indent=1) + "\n")


def _peaks(children: list[Child]) -> dict[str, float | None]:
    # poll() first: a child it finds running is not reaped until _stop waits for it, so its pid is still its own
    running = {c.name: c.proc.pid for c in children if c.proc.poll() is None}
    peaks = tree_peaks_mib(running)
    return {c.name: peaks.get(c.name) for c in children}


def _stop(children: list[Child], timeout_s: float) -> None:
    for child in children:
        _signal_group(child.proc, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for child in children:
        try:
            child.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for child in children:
        _signal_group(child.proc, signal.SIGKILL)  # also takes grandchildren left in the group
        child.proc.wait()


def _wait_groups_gone(children: list[Child], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while any(group_alive(c.proc.pid) for c in children) and time.monotonic() < deadline:
        time.sleep(0.05)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the child leads its own session, so pgid == pid
    except (ProcessLookupError, PermissionError):
        pass


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
