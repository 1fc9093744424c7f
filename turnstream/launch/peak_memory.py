"""Each role's peak resident memory, read just before the launcher signals it at the stop, written to
`<run_dir>/memory.json` (process name -> MiB) and logged in one line.

A process's figure is the sum of VmHWM, the kernel's high-water mark of its resident memory
(`/proc/<pid>/status`), over its process tree: the process the launcher started and each live descendant (a
vLLM server's engine core, an actor's environment workers). The processes of a tree need not peak at the same
moment, and pages they share (copy-on-write after a fork, shared memory) count once per process, so the sum is an
upper bound of the tree's peak. A descendant that exited before the stop is not in it, and a process that had
exited itself has no high-water mark left to read: it is recorded as not measured (None). psutil, which the
tests use, reports only the current resident size on Linux, hence /proc read directly.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from turnstream.reports.run_log import MEMORY_FILE

log = logging.getLogger("turnstream.launcher")
MIB = 1024 * 1024


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process this one can see; {} where there is no /proc."""
    parents: dict[int, int] = {}
    try:
        entries = list(os.scandir("/proc"))
    except OSError:
        return parents
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            # the command name, in parentheses, may hold spaces and ")": the fields after the last ")" are fixed
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone between the listing and the read
    return parents


def _tree(root: int, parents: dict[int, int]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, ()))
    return tree


def peak_resident_bytes(pid: int) -> int | None:
    """VmHWM of one process; None when it is gone, a zombie, or /proc has no such line."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # the kernel writes kB
    except (OSError, IndexError, ValueError):
        pass
    return None


def tree_peaks_mib(roots: dict[str, int]) -> dict[str, float | None]:
    """Each named process's peak MiB summed over its process tree; None for one whose own peak cannot be read.

    Call only with processes that have not been reaped, so that no pid here can be another process's by now."""
    parents = _parents()
    peaks: dict[str, float | None] = {}
    for name, root in roots.items():
        own = peak_resident_bytes(root)
        if own is None:
            peaks[name] = None  # exited: what its descendants held alone would understate it
            continue
        rest = (peak_resident_bytes(pid) for pid in _tree(root, parents)[1:])
        peaks[name] = round((own + sum(b for b in rest if b is not None)) / MIB, 1)
    return peaks


def summary_line(peaks: dict[str, float | None]) -> str:
    measured = ", ".join(f"{name} {mib:.0f} MiB" for name, mib in peaks.items() if mib is not None)
    line = f"peak memory, each process tree summed: {measured or 'none measured'}"
    missing = [name for name, mib in peaks.items() if mib is None]
    return line + (f"; not measured (exited before the stop): {', '.join(missing)}" if missing else "")


def record_peak_memory(run_dir: str | Path, peaks: dict[str, float | None]) -> None:
    """memory.json in the run directory and one log line. The stop goes on whatever happens: a file that cannot
    be written is a warning."""
    log.info("%s", summary_line(peaks))
    path = Path(run_dir) / MEMORY_FILE
    try:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(peaks, indent=1) + "\n")
        tmp.replace(path)
    except OSError as exc:
        log.warning("could not write %s: %s", path, exc)
