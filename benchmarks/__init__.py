"""Benchmarks: each module `benchmarks/<name>.py` has `main(argv) -> int` and prints one JSON line last.

Run as `turnstream bench <name> [args]` from a source checkout; results and the commands that produced them
go in BENCHMARKS.md. The folder is not part of the installed package: it is the plain package `benchmarks`,
imported with the checkout's root on the import path.
"""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the checkout's root: `benchmarks` imports from there


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child that runs `python -m benchmarks.NAME`: the checkout's root on
    its PYTHONPATH (wherever its working directory is), and `extra`."""
    path = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    return {**os.environ, "PYTHONPATH": path, **extra}
