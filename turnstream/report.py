"""Learning curves from a run directory's learner.jsonl."""
from __future__ import annotations

import json
from pathlib import Path


def read_steps(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "learner.jsonl"
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        try:
            steps.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line being written right now
    return steps


def rolling_success(steps: list[dict], window_episodes: int) -> float:
    """Episode-weighted mean return of the newest batches covering at least `window_episodes` episodes."""
    total, weighted = 0, 0.0
    for s in reversed(steps):
        total += s["episodes"]
        weighted += s["return_mean"] * s["episodes"]
        if total >= window_episodes:
            break
    return weighted / total if total else 0.0


def plot_learning_curve(run_dir: str | Path, out: str | Path | None = None, t0: float | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = read_steps(run_dir)
    out = Path(out or Path(run_dir) / "learning_curve.png")
    fig, ax = plt.subplots(figsize=(7, 4))
    if steps:
        start = t0 if t0 is not None else steps[0]["time"] - steps[0]["wall_s"]
        xs = [s["time"] - start for s in steps]
        ax.plot(xs, [s["return_mean"] for s in steps], marker=".", label="batch success")
        ax.plot(xs, [rolling_success(steps[: i + 1], 256) for i in range(len(steps))], label="rolling success")
    ax.set_xlabel("wall-clock seconds")
    ax.set_ylabel("success rate")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(f"turnstream: {Path(run_dir).name}")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
