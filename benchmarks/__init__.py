"""Benchmarks: each module `bench/<name>.py` has `main(argv) -> int` and prints one JSON line last.

Run as `turnstream bench <name> [args]`; results and the commands that produced them go in BENCHMARKS.md.
"""
