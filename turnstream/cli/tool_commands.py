"""Small tools: envs (the registered environments), keygen (CURVE keys), bench (a source checkout's benchmarks,
bench.py)."""
from __future__ import annotations

import argparse

from turnstream.cli.command import Command, no_arguments


def _run_envs(args: argparse.Namespace) -> int:
    from turnstream.actors.envs.registry import describe, known_envs

    names = known_envs()
    width = max(map(len, names), default=0)
    print("\n".join(f"{name:<{width}}  {describe(name)}" for name in names))
    return 0


def _keygen_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir")


def _run_keygen(args: argparse.Namespace) -> int:
    from turnstream.keygen import main

    return main(args.dir)


def _bench_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="benchmark name, e.g. dataplane")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark")


def _run_bench(args: argparse.Namespace) -> int:
    from turnstream.cli.bench import run_benchmark

    return run_benchmark(args.name, args.args)


ENVS = Command("envs", "list the registered environments", no_arguments, _run_envs)
KEYGEN = Command("keygen", "write CURVE keys for network.keys_dir (server, client, allowed_clients/)",
                 _keygen_arguments, _run_keygen)
BENCH = Command("bench", "run a benchmark of a source checkout's benchmarks/ (prints one JSON line last)",
                _bench_arguments, _run_bench)
