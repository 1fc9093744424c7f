"""`turnstream bench dataplane-ab`: the 1 MB "ours" row of `bench dataplane`, variant against variant.

One full `bench dataplane` run cannot resolve a change of a few percent: raw, the baseline, moves by a third
between runs. This bench runs only what a data-path change touches, alternating: every round measures raw,
then each variant, in that order, seconds apart. A variant is a checkout of the project (`--checkout`, e.g. a
`git worktree` of an older commit; default this one) and optionally a bundle size for the sender
(`--bundle-chunks`, actors.link.MAX_BUNDLE_CHUNKS; "-" leaves it as the checkout has it). Each measurement
runs in a fresh process from its checkout. Prints one line per round, then one JSON line: per variant the
medians of chunks/s, ours/raw and the CPU figures, and the median of its per-round ratio to the first variant.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
from pathlib import Path

# Runs inside each checkout, older ones included, so it uses only what their bench/dataplane.py has too: the
# row's settings (1 MB, window 32, `bench dataplane`'s defaults) are written out here, not imported.
MEASURE = r"""
import json, sys, tempfile
from pathlib import Path
sys.path.insert(0, ".")
from turnstream.bench.dataplane import bench_ours, bench_raw, make_chunk_arrays
what, n, bundle_chunks = sys.argv[1], int(sys.argv[2]), sys.argv[3]
obs, arrays = make_chunk_arrays(1 << 20)
if bundle_chunks != "-":
    from turnstream.actors import link
    link.MAX_BUNDLE_CHUNKS = int(bundle_chunks)
if what == "raw":
    seconds, cpu = bench_raw(n, obs, arrays)
else:
    with tempfile.TemporaryDirectory() as tmp:
        seconds, cpu = bench_ours(n, obs, arrays, wal=False, window=32, workdir=Path(tmp))
print(json.dumps({"chunks_per_s": n / seconds, **cpu}))
"""


def measure(checkout: Path, what: str, chunks: int, bundle_chunks: str) -> dict:
    out = subprocess.run([sys.executable, "-c", MEASURE, what, str(chunks), bundle_chunks], cwd=checkout,
                         capture_output=True, text=True, timeout=300)
    if out.returncode:
        raise RuntimeError(f"measurement in {checkout} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="turnstream bench dataplane-ab", description=__doc__.splitlines()[0])
    p.add_argument("--checkout", nargs="+", type=Path, default=[Path.cwd()], help="project checkouts to compare")
    p.add_argument("--bundle-chunks", nargs="+", default=["-"], help='bundle sizes to compare ("-": as is)')
    p.add_argument("--rounds", type=int, default=14)
    p.add_argument("--chunks", type=int, default=1000, help="1 MB chunks per measurement")
    args = p.parse_args(argv)
    variants = [(checkout.resolve(), size) for checkout, size in itertools.product(args.checkout, args.bundle_chunks)]
    names = [f"{checkout.name}:{size}" for checkout, size in variants]
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for round_ in range(args.rounds):
        raw = measure(Path.cwd(), "raw", args.chunks, "-")["chunks_per_s"]
        for name, (checkout, size) in zip(names, variants):
            figures = measure(checkout, "ours", args.chunks, size)
            runs[name].append({**figures, "ours_per_raw": figures["chunks_per_s"] / raw})
        print(f"round {round_ + 1}: raw {raw:.0f} chunks/s; " + "; ".join(
            f"{name} {runs[name][-1]['chunks_per_s']:.0f} ({runs[name][-1]['ours_per_raw']:.3f} of raw)"
            for name in names), flush=True)
    first = runs[names[0]]
    result = {name: {**{key: round(statistics.median(r[key] for r in rs), 3) for key in rs[0]},
                     "pairwise_vs_first": round(statistics.median(
                         r["chunks_per_s"] / f["chunks_per_s"] for r, f in zip(rs, first)), 3)}
              for name, rs in runs.items()}
    print(json.dumps({"rounds": args.rounds, "chunks": args.chunks, "variants": result}))
    return 0
