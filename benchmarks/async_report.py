"""The async-vs-sync plot of `turnstream bench async`'s records, which the benchmark draws when its grid is done;
`turnstream bench async-report OUT_DIR` draws it from the records written so far.

One panel per environment, one colour per eta: every seed's rolling success against wall-clock seconds
(faint), their median (bold), the target as a dashed line. A run stops at the target, so its curve ends
there; the median holds each finished seed at its last value (the run had reached the target, and
dropping it would leave only the slow seeds in the median).
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from turnstream.reports.plotting import pyplot

RECORDS = "records.jsonl"
PLOT = "async_vs_sync.png"


def read_records(out_dir: str | Path) -> list[dict]:
    path = Path(out_dir) / RECORDS
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a record being written right now
    return out


def value_at(curve: list[list[float]], t: float) -> float | None:
    """The curve's value at time t as a step function; None before its first point."""
    value = None
    for x, y in curve:
        if x > t:
            break
        value = y
    return value


def median_curve(curves: list[list[list[float]]], points: int = 200) -> tuple[list[float], list[float]]:
    """Median over curves on a common time grid; a time where no curve has started yet is left out."""
    end = max((c[-1][0] for c in curves if c), default=0.0)
    xs, ys = [], []
    for i in range(points + 1):
        t = end * i / points
        values = [v for c in curves if (v := value_at(c, t)) is not None]
        if values:
            xs.append(t)
            ys.append(statistics.median(values))
    return xs, ys


def plot(out_dir: str | Path) -> Path:
    plt = pyplot()
    records = read_records(out_dir)
    envs = list(dict.fromkeys(r["env"] for r in records)) or ["(no records)"]
    fig, axes = plt.subplots(1, len(envs), figsize=(max(8.0, 6.5 * len(envs)), 4.8), squeeze=False, sharey=True)
    colours = plt.get_cmap("viridis")
    etas = sorted({r["eta"] for r in records})
    for ax, env in zip(axes[0], envs):
        for i, eta in enumerate(etas):
            runs = [r for r in records if r["env"] == env and r["eta"] == eta]
            if not runs:
                continue
            colour = "tab:red" if eta == 0 else colours(0.15 + 0.7 * i / max(1, len(etas) - 1))
            for r in runs:
                xs, ys = zip(*r["curve"]) if r["curve"] else ((), ())
                ax.plot(xs, ys, color=colour, alpha=0.3, linewidth=1, drawstyle="steps-post")
                if r.get("seconds_to_target") is not None:
                    ax.plot([r["seconds_to_target"]], [r["target"]], "o", color=colour, alpha=0.5, markersize=3)
            xs, ys = median_curve([r["curve"] for r in runs])
            label = f"eta={eta}" + (" (sync)" if eta == 0 else "") + f", {len(runs)} seed(s)"
            ax.plot(xs, ys, color=colour, linewidth=2.2, label=label, drawstyle="steps-post")
        if records:
            target = records[0]["target"]
            ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target}")
            ax.legend(loc="upper left", fontsize=8)
        else:
            ax.text(0.5, 0.5, f"no {RECORDS}", ha="center", va="center", transform=ax.transAxes)
        ax.set(title=env, xlabel="wall-clock seconds since the run started", ylim=(0, 1.02))
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("rolling success (trained episodes)")
    fig.suptitle("turnstream bench async: success against wall-clock per eta\n"
                 "(median over seeds bold, each seed faint)", fontsize=11)
    fig.tight_layout()
    path = Path(out_dir) / PLOT
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="turnstream bench async-report", description=__doc__.splitlines()[0])
    p.add_argument("out", help="the output directory of `turnstream bench async` (it holds records.jsonl)")
    out = p.parse_args(argv).out
    if not (Path(out) / RECORDS).exists():
        print(f"bench async-report: {out} has no {RECORDS}")
        return 1
    print(plot(out))
    return 0
