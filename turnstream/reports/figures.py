"""Plots of a run directory's learner.jsonl: `turnstream report RUN_DIR` and the demo's learning curve.

Plots skip keys a log does not have, so older runs and other estimators still get every plot their log supports.
With held-out evaluation (`tasks.eval_split`) the success plots get a second panel: evaluation success against
learner version (the actors' lines of one version pooled), next to the training batches' mean return at the
same versions, and on a second scale the rounds' mean of each figure the environment reported (eval.jsonl's
"info"). memory.png draws each process's peak memory at the stop (memory.json, written by the launcher).
"""
from __future__ import annotations

import math
from pathlib import Path

from turnstream.reports.plotting import pyplot
from turnstream.reports.run_log import (MEMORY_FILE, pooled_eval_info, pooled_evals, read_evals, read_peak_memory,
                                        read_steps, rolling_success, staleness_totals, start_time, throughput)

REPORT_FILES = ("success.png", "staleness.png", "throughput.png", "losses.png", "weight_sync.png", "memory.png")
# the evaluation panel's figure means: colours other than its own blue and red
INFO_COLOURS = ("tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:orange")
LOSS_KEYS = ("policy_loss", "value_loss", "step_kl", "approx_kl", "entropy", "clip_fraction", "grad_norm",
             "is_weight_mean", "is_weight_truncated_fraction")


def plot_learning_curve(run_dir: str | Path, out: str | Path | None = None, t0: float | None = None) -> Path:
    plt = pyplot()
    out = Path(out or Path(run_dir) / "learning_curve.png")
    fig = _success_figure(plt, run_dir, t0)
    fig.suptitle(f"turnstream: {Path(run_dir).name}")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _success_axes(ax, steps: list[dict], t0: float | None, window: int = 256) -> None:
    if steps:
        start = start_time(steps, t0)
        xs = [s["time"] - start for s in steps]
        ax.plot(xs, [s["return_mean"] for s in steps], marker=".", label="batch success")
        ax.plot(xs, [rolling_success(steps[: i + 1], window) for i in range(len(steps))],
                label=f"rolling success ({window} episodes)")
        ax.legend(loc="lower right")
    else:
        _no_data(ax)
    ax.set_xlabel("wall-clock seconds")
    ax.set_ylabel("success rate (mean return)")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)


def _success_figure(plt, run_dir: str | Path, t0: float | None):
    """The training curve, and beside it the evaluation curve when the run has eval.jsonl."""
    steps, lines = read_steps(run_dir), read_evals(run_dir)
    evals = pooled_evals(lines)
    if not evals:
        fig, ax = plt.subplots(figsize=(7, 4))
        _success_axes(ax, steps, t0)
        return fig
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    _success_axes(left, steps, t0)
    right.plot([s["version"] for s in steps], [s["return_mean"] for s in steps], alpha=0.4,
               label="training batches (mean return)")
    right.plot([e[0] for e in evals], [e[1] for e in evals], marker="o", color="tab:red",
               label=f"held-out tasks ({evals[-1][2]} episodes per round)")
    right.set(xlabel="learner version", ylabel="success rate", ylim=(0, 1.02), title="evaluation")
    right.legend(loc="lower right")
    right.grid(alpha=0.3)
    _eval_info_axes(right, pooled_eval_info(lines))
    return fig


def _eval_info_axes(ax, info: dict[int, dict[str, float]]) -> None:
    """The held-out rounds' mean of each figure the environment reported, on a scale of their own."""
    keys = sorted({key for means in info.values() for key in means})
    if not keys:
        return
    twin = ax.twinx()
    for i, key in enumerate(keys):
        versions = [v for v, means in info.items() if key in means]
        twin.plot(versions, [info[v][key] for v in versions], marker="x", linestyle="--",
                  color=INFO_COLOURS[i % len(INFO_COLOURS)], label=f"mean {key}")
    twin.set_ylabel("episode info (held-out mean)")
    twin.legend(loc="upper left")


def _no_data(ax) -> None:
    ax.text(0.5, 0.5, "no data in learner.jsonl", ha="center", va="center", transform=ax.transAxes)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def write_report(run_dir: str | Path, out_dir: str | Path | None = None, t0: float | None = None) -> list[Path]:
    """One PNG per topic in <run_dir>/report (or out_dir); returns their paths in REPORT_FILES order."""
    plt = pyplot()
    steps = read_steps(run_dir)
    out_dir = Path(out_dir or Path(run_dir) / "report")
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = {
        "success.png": ("success and reward", lambda: _success_figure(plt, run_dir, t0)),
        "staleness.png": ("staleness of trained tokens", lambda: _staleness_figure(plt, steps, t0)),
        "throughput.png": ("throughput into the learner", lambda: _throughput_figure(plt, steps, t0)),
        "losses.png": ("learner losses and diagnostics", lambda: _losses_figure(plt, steps)),
        "weight_sync.png": ("weight-sync latency and learner time", lambda: _weight_sync_figure(plt, steps)),
        "memory.png": ("peak memory of each process", lambda: memory_figure(plt, read_peak_memory(run_dir))),
    }
    paths = []
    for filename in REPORT_FILES:
        title, draw = figures[filename]
        fig = draw()
        fig.suptitle(f"turnstream {Path(run_dir).name}: {title}")
        fig.tight_layout()
        fig.savefig(out_dir / filename, dpi=90)
        plt.close(fig)
        paths.append(out_dir / filename)
    return paths


def _seconds(steps: list[dict], t0: float | None) -> list[float]:
    start = start_time(steps, t0) if steps else 0.0
    return [s["time"] - start for s in steps]


def _staleness_figure(plt, steps: list[dict], t0: float | None):
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    totals = staleness_totals(steps)
    if totals:
        xs = _seconds(steps, t0)
        left.bar(list(totals), list(totals.values()))
        left.set_xticks(list(totals))
        right.plot(xs, [s.get("staleness_mean", float("nan")) for s in steps], label="mean")
        right.plot(xs, [s.get("staleness_max", float("nan")) for s in steps], label="max", drawstyle="steps-post")
        right.legend()
    else:
        _no_data(left)
        _no_data(right)
    left.set(xlabel="staleness (policy versions behind)", ylabel="action tokens trained", title="distribution")
    right.set(xlabel="wall-clock seconds", ylabel="staleness (versions)", title="per step")
    return fig


def _throughput_figure(plt, steps: list[dict], t0: float | None):
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    rates = throughput(steps, t0)
    if rates:
        top.plot([r[0] for r in rates], [r[1] for r in rates], marker=".")
        bottom.plot([r[0] for r in rates], [r[2] for r in rates], marker=".", color="tab:green")
    else:
        _no_data(top)
    top.set(ylabel="batch tokens / s (whole sequences)")
    bottom.set(xlabel="wall-clock seconds", ylabel="trained episodes / s")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    return fig


def _losses_figure(plt, steps: list[dict]):
    keys = [k for k in LOSS_KEYS if any(_finite(s.get(k)) for s in steps)]
    cols = 3
    rows = max(1, math.ceil(len(keys) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(11, 3 * rows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        ax.plot([s["version"] for s in steps], [s.get(key, float("nan")) for s in steps], marker=".")
        ax.set(title=key, xlabel="learner step (policy version)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    if not keys:
        _no_data(axes.flat[0])
    return fig


def _weight_sync_figure(plt, steps: list[dict]):
    fig, ax = plt.subplots(figsize=(8, 4))
    if steps:
        versions = [s["version"] for s in steps]
        for key, label in (("push_s", "weight push (pause to resume)"), ("wait_s", "waiting for a batch"),
                           ("step_s", "training step")):
            ax.plot(versions, [s.get(key, float("nan")) for s in steps], marker=".", label=label)
        failed = [v for v, s in zip(versions, steps) if "push_s" in s and not _finite(s["push_s"])]
        if failed:
            ax.scatter(failed, [0] * len(failed), marker="x", color="red", label=f"failed pushes ({len(failed)})")
        ax.legend()
    else:
        _no_data(ax)
    ax.set(xlabel="learner step (policy version)", ylabel="seconds")
    ax.grid(alpha=0.3)
    return fig


def memory_figure(plt, peaks: dict[str, float | None]):
    """A bar per process (its peak MiB, summed over its process tree); a process not measured gets an empty bar
    and a note."""
    fig, ax = plt.subplots(figsize=(8, 4))
    if peaks:
        names = list(peaks)
        heights = [peaks[n] or 0.0 for n in names]
        bars = ax.bar(names, heights)
        ax.bar_label(bars, labels=["not measured" if peaks[n] is None else f"{peaks[n]:.0f}" for n in names])
        ax.set_xticks(range(len(names)), names)
    else:
        ax.text(0.5, 0.5, f"no {MEMORY_FILE} (written when the launcher stops the run)", ha="center", va="center",
                transform=ax.transAxes)
    ax.set(ylabel="peak resident MiB (sum over the process tree)")
    ax.grid(alpha=0.3, axis="y")
    return fig


def main(run_dir: str | Path) -> int:
    """`turnstream report RUN_DIR`: the learning curve plus the report plots; prints each path."""
    if not (Path(run_dir) / "learner.jsonl").exists():
        print(f"turnstream report: {run_dir} has no learner.jsonl")
        return 1
    print(plot_learning_curve(run_dir))
    for path in write_report(run_dir):
        print(path)
    return 0
