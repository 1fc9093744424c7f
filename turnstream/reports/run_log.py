"""A run directory's logs, read: learner.jsonl (one line per optimizer step, learner/serve.py), eval.jsonl
(one line per held-out evaluation round and actor, actors/evaluation.py) and memory.json (each role's peak memory,
written by the launcher at the stop, launch/peak_memory.py), and the sums the reports, the launcher's progress
line, the tools and the benchmarks take of them.

A learner.jsonl line: return_mean, episodes, tokens, version, policy_loss, step_kl, approx_kl, entropy,
clip_fraction, grad_norm, staleness_hist/_mean/_max, step_s, wait_s, push_s (NaN when the push failed), wall_s and
time. An eval.jsonl line: {"version", "success", "episodes", "time", "actor"}, and where the round's episodes reported
figures (numbers of their last Step.info) "info" (key -> mean) and "info_episodes" (key -> episodes). memory.json: {process name: peak MiB,
or null when the process had exited before the stop}.
"""
from __future__ import annotations

import json
from pathlib import Path


def read_steps(run_dir: str | Path) -> list[dict]:
    return _read_jsonl(Path(run_dir) / "learner.jsonl")


def steps_by_version(run_dir: str | Path) -> dict[int, dict]:
    """learner.jsonl by the version each line's step produced. A version a restarted learner trained again keeps
    its last line, the lineage's; a line torn by a kill (anywhere in the file: the restarted learner goes on after
    it) is skipped."""
    path = Path(run_dir) / "learner.jsonl"
    lines: dict[int, dict] = {}
    if path.is_file():
        for raw in path.read_text().splitlines():
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            if isinstance(entry, dict) and "version" in entry:
                lines[int(entry["version"])] = entry
    return lines


def read_evals(run_dir: str | Path) -> list[dict]:
    """The eval.jsonl lines of a run (none without held-out evaluation)."""
    return _read_jsonl(Path(run_dir) / "eval.jsonl")


MEMORY_FILE = "memory.json"


def read_peak_memory(run_dir: str | Path) -> dict[str, float | None]:
    """memory.json of a run: each process's peak MiB (None: not measured); {} when the run has none (yet)."""
    try:
        peaks = json.loads((Path(run_dir) / MEMORY_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return peaks if isinstance(peaks, dict) else {}


def _read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line being written right now
    return records


def pooled_evals(evals: list[dict]) -> list[tuple[int, float, int]]:
    """(version, success, episodes) per evaluation round, the actors' parts pooled, by version."""
    pooled: dict[int, list[float]] = {}
    for e in evals:
        totals = pooled.setdefault(int(e["version"]), [0.0, 0])
        totals[0] += e["success"] * e["episodes"]
        totals[1] += e["episodes"]
    return [(v, won / n, int(n)) for v, (won, n) in sorted(pooled.items()) if n]


def pooled_eval_info(evals: list[dict]) -> dict[int, dict[str, float]]:
    """version -> key -> mean of the figure over the round's episodes that reported it, the actors' parts pooled
    (weighted by each line's "info_episodes", or by its "episodes" where a line has no counts); versions whose lines
    carry no "info" are left out."""
    pooled: dict[int, dict[str, list[float]]] = {}
    for e in evals:
        counts = e.get("info_episodes") or {}
        for key, mean in (e.get("info") or {}).items():
            n = counts.get(key, e["episodes"])
            totals = pooled.setdefault(int(e["version"]), {}).setdefault(key, [0.0, 0])
            totals[0] += mean * n
            totals[1] += n
    return {v: {k: total / n for k, (total, n) in keys.items() if n} for v, keys in sorted(pooled.items())}


def held_out_summary(evals: list[dict]) -> dict:
    """The demo's held-out keys: success of the first and last rounds (eval_start, eval_end, eval_end_version) and,
    where the environment reported figures, their means at the first and last rounds that have them
    (eval_info_start, eval_info_end); {} without evaluation."""
    pooled = pooled_evals(evals)
    if not pooled:
        return {}
    summary = {"eval_start": pooled[0][1], "eval_end": pooled[-1][1], "eval_end_version": pooled[-1][0]}
    info = pooled_eval_info(evals)
    if info:
        summary |= {"eval_info_start": info[min(info)], "eval_info_end": info[max(info)]}
    return summary


def rolling_success(steps: list[dict], window_episodes: int) -> float:
    """Episode-weighted mean return of the newest batches covering at least `window_episodes` episodes."""
    total, weighted = 0, 0.0
    for s in reversed(steps):
        total += s["episodes"]
        weighted += s["return_mean"] * s["episodes"]
        if total >= window_episodes:
            break
    return weighted / total if total else 0.0


def start_time(steps: list[dict], t0: float | None) -> float:
    """When the run began: `t0`, or the first step's start."""
    return t0 if t0 is not None else steps[0]["time"] - steps[0]["wall_s"]


def staleness_totals(steps: list[dict]) -> dict[int, int]:
    """Action tokens trained at each staleness (policy versions behind), over the whole run."""
    totals: dict[int, int] = {}
    for s in steps:
        for k, n in (s.get("staleness_hist") or {}).items():
            totals[int(k)] = totals.get(int(k), 0) + int(n)
    return dict(sorted(totals.items()))


def throughput(steps: list[dict], t0: float | None = None) -> list[tuple[float, float, float]]:
    """(seconds since start, trained tokens/s, trained episodes/s) per step, over the time since the
    previous step, i.e. the rate the whole pipeline delivered to the learner."""
    out = []
    if not steps:
        return out
    prev = start_time(steps, t0)
    for s in steps:
        dt = s["time"] - prev
        if dt > 0:
            out.append((s["time"] - start_time(steps, t0), s.get("tokens", 0) / dt, s.get("episodes", 0) / dt))
        prev = s["time"]
    return out
