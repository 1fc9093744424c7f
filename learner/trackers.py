"""Experiment trackers (`[logging] trackers`): every learner step's stats, and the evaluation success rate the
actors append to <run_dir>/eval.jsonl, written to TensorBoard event files and to a W&B run.

Trackers listen to the learner's loop (learner/events.py): each VersionPublished's stats, the line rank 0 logs to
learner.jsonl, go to `Trackers.step`, and LearnerStopped closes them. Both axes are
the learner version: a step's numbers at the version it produced, an evaluation round at the version it
played. W&B wants one monotonic step per run, and evaluation rounds arrive late and out of step with
training, so each axis there is its own step metric (`learner/version`, `eval/version`).

The packages (the `integrations` extra) are imported only when a tracker is configured. A tracker that fails
while the learner runs (a full disk, say) is logged and switched off; training never stops for a tracker.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Protocol

from turnstream.core.configtools import ConfigError
from turnstream.learner.events import LearnerEvent, LearnerStopped, VersionPublished

log = logging.getLogger("turnstream.learner")

# wall-clock stamps in a step's stats: when things happened, not measurements to plot
TIMESTAMPS = frozenset({"time", "step_started", "push_started"})
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}


def step_scalars(stats: dict) -> dict[str, float]:
    """`learner/<key>` for every number of a step's stats; a dict of numbers (staleness_hist) as
    `learner/<key>/<bucket>`."""
    values: dict[str, float] = {}
    for key, value in stats.items():
        if key in TIMESTAMPS or key == "version":
            continue
        if isinstance(value, (int, float)):
            values[f"learner/{key}"] = float(value)
        elif isinstance(value, dict):
            values.update({f"learner/{key}/{k}": float(v) for k, v in value.items() if isinstance(v, (int, float))})
    return values


class EvalRounds:
    """The evaluation rounds of eval.jsonl, each actor's part pooled (episode-weighted, as `turnstream report`
    does), reported once: when every actor process has written its part, when a later version shows up,
    or at the end of the run."""

    def __init__(self, path: Path, actors: int):
        self.path, self.actors, self.offset = path, actors, 0
        self.rounds: dict[int, tuple[set[str], float, int]] = {}  # version -> (actors, successes, episodes)

    def _read_new_lines(self) -> list[dict]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        whole = data[:data.rfind(b"\n") + 1]  # a line being appended right now waits for the next read
        self.offset += len(whole)
        records = []
        for line in whole.splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                log.warning("trackers: skipped an unreadable line of %s", self.path)
        return records

    def complete(self) -> list[tuple[int, float, int]]:
        """(version, success, episodes) of the rounds completed since the last call, oldest first."""
        for r in self._read_new_lines():
            actors, won, n = self.rounds.get(int(r["version"]), (set(), 0.0, 0))
            episodes = int(r["episodes"])
            self.rounds[int(r["version"])] = (actors | {str(r.get("actor"))}, won + r["success"] * episodes,
                                              n + episodes)
        newest = max(self.rounds, default=None)
        done = [v for v, (actors, _, _) in self.rounds.items() if v != newest or len(actors) >= self.actors]
        return self._pop(done)

    def remaining(self) -> list[tuple[int, float, int]]:
        self.complete()
        return self._pop(list(self.rounds))

    def _pop(self, versions: list[int]) -> list[tuple[int, float, int]]:
        out = []
        for v in sorted(versions):
            _, won, n = self.rounds.pop(v)
            if n:
                out.append((v, won / n, n))
        return out


class Sink(Protocol):
    def write(self, values: dict[str, float], axis: str, version: int) -> None: ...

    def close(self) -> None: ...


class TensorBoardSink:
    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(log_dir / "tensorboard"))

    def write(self, values: dict[str, float], axis: str, version: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, version)
        self.writer.flush()  # a step is seconds apart: make each one readable at once

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, cfg, log_dir: Path):
        import wandb

        lg = cfg.logging
        log_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=lg.wandb_project, entity=lg.wandb_entity or None,
                              name=lg.wandb_name or Path(cfg.run.run_dir).name, dir=str(log_dir),
                              mode=lg.wandb_mode, config=cfg.model_dump(),
                              # the learner's stdout is its log file: no copy of it into the run
                              settings=wandb.Settings(console="off"))
        for axis in ("learner", "eval"):
            self.run.define_metric(f"{axis}/version")
            self.run.define_metric(f"{axis}/*", step_metric=f"{axis}/version")

    def write(self, values: dict[str, float], axis: str, version: int) -> None:
        self.run.log({**values, f"{axis}/version": version})

    def close(self) -> None:
        self.run.finish()


def _open_sink(name: str, cfg, log_dir: Path) -> Sink:
    try:
        return TensorBoardSink(log_dir) if name == "tensorboard" else WandbSink(cfg, log_dir)
    except ImportError as exc:
        raise ConfigError(f"logging.trackers: {name} needs the {PACKAGES[name]} package ({exc}); install "
                          f"turnstream[integrations]") from None


class Trackers:
    """The configured sinks (none: every call does nothing) and the evaluation rounds still to report."""

    def __init__(self, sinks: dict[str, Sink], evals: EvalRounds | None):
        self.sinks, self.evals = sinks, evals

    async def on_event(self, event: LearnerEvent) -> dict[str, float]:
        if isinstance(event, VersionPublished):
            self.step(dict(event.stats))
        elif isinstance(event, LearnerStopped):
            self.close()
        return {}

    def step(self, stats: dict) -> None:
        if not self.sinks:
            return
        self._write(step_scalars(stats), "learner", int(stats["version"]))
        self._write_evals(self.evals.complete())

    def _write_evals(self, rounds: list[tuple[int, float, int]]) -> None:
        for version, success, episodes in rounds:
            self._write({"eval/success": success, "eval/episodes": float(episodes)}, "eval", version)

    def _write(self, values: dict[str, float], axis: str, version: int) -> None:
        for name, sink in list(self.sinks.items()):
            try:
                sink.write(values, axis, version)
            except Exception:  # noqa: BLE001 - a tracker never stops training
                log.exception("trackers: %s failed and is switched off", name)
                del self.sinks[name]

    def close(self) -> None:
        if not self.sinks:
            return
        self._write_evals(self.evals.remaining())
        for name, sink in self.sinks.items():
            try:
                sink.close()
            except Exception:  # noqa: BLE001
                log.exception("trackers: closing %s failed", name)
        self.sinks = {}


def open_trackers(cfg) -> Trackers:
    """The trackers `cfg.logging` names; a ConfigError (exit status 2) when a package is missing."""
    lg, run_dir = cfg.logging, Path(cfg.run.run_dir)
    log_dir = Path(lg.dir) if lg.dir else run_dir / "trackers"
    sinks = {name: _open_sink(name, cfg, log_dir) for name in lg.trackers}
    if sinks:
        log.info("trackers: %s under %s", ", ".join(sinks), log_dir)
    return Trackers(sinks, EvalRounds(run_dir / "eval.jsonl", cfg.actor.num_processes))
