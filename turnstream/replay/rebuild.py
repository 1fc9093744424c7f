"""A learner Trainer rebuilt from a run's starting weights or one of its checkpoints, stepped through the run's
recorded batches (learner/record/): the run's own learner, less the buffer, servers and pushes.

A rebuilt Trainer starts as a learner process does (learner/main.py: threads, seed, then the model, restored from
the checkpoint if any), and each recorded step trains the batch as served, after the Trainer's generator is set to
the state the run's step drew from (its only random numbers)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from turnstream.core.config import Config
from turnstream.core.configtools import ConfigError
from turnstream.learner.checkpoint.layout import version_of
from turnstream.learner.device import set_torch_threads
from turnstream.learner.main import build_trainer
from turnstream.learner.record.reader import Record, RecordedStep, RecordError, open_record
from turnstream.learner.record.writer import generator_state
from turnstream.learner.step.trainer import Trainer

log = logging.getLogger("turnstream.replay")


@dataclass(frozen=True)
class Start:
    """Where a replay starts: a checkpoint, or (None) the run's model.path at version 0."""
    version: int
    checkpoint: Path | None

    def describe(self) -> str:
        return f"checkpoint {self.checkpoint}" if self.checkpoint else "model.path (version 0)"


def run_checkpoints(run_dir: Path) -> dict[int, Path]:
    """The run's complete checkpoints by version (learner/checkpoint/layout.py)."""
    root = Path(run_dir) / "checkpoints"
    return {version_of(p): p for p in sorted(root.glob("step-*")) if (p / "trainer.pt").is_file()}


def start_of(record: Record, checkpoint: str | Path | None = None) -> Start:
    """`checkpoint` (a checkpoint directory), else where the run's first learner started."""
    if checkpoint is not None:
        path = Path(checkpoint)
        if not (path / "trainer.pt").is_file():
            raise ConfigError(f"replay --from-checkpoint: {checkpoint} is not a learner checkpoint (no trainer.pt)")
        return Start(version_of(path), path)
    first = record.first()
    if not first.resumed_from:
        return Start(first.start_version, None)
    path = Path(first.resumed_from)
    if not (path / "trainer.pt").is_file():
        raise ConfigError(f"replay: the run started from checkpoint {path}, which is gone (pruned?); pass "
                          "--from-checkpoint with one of the run's checkpoints")
    return Start(first.start_version, path)


def build(cfg: Config, start: Start, rank: int = 0, world: int = 1) -> Trainer:
    """A Trainer as a learner process starting at `start` builds it (the seed first: a critic's initial weights
    draw from it)."""
    if start.checkpoint is None and not Path(cfg.model.path, "config.json").is_file():
        raise ConfigError(f"model.path: the run's starting weights {cfg.model.path} are gone; pass --from-checkpoint "
                          "or --set model.path=... (the same weights)")
    cfg = cfg.model_copy(deep=True)
    cfg.learner.resume = False  # only `start` is restored
    torch.manual_seed(cfg.run.seed)
    _, trainer, _ = build_trainer(cfg, rank, world, checkpoint=start.checkpoint)
    return trainer


class Stepper:
    """Recorded steps into a Trainer; counts the steps whose generator state the Trainer did not already hold
    (none in a faithful replay: the state only tells where a replay that skipped or changed steps must be)."""

    def __init__(self, trainer: Trainer):
        self.trainer = trainer
        self.rng_mismatches = 0

    def step(self, recorded: RecordedStep) -> dict:
        trainer = self.trainer
        if trainer.version != recorded.learner_version:
            raise RecordError(f"replay: the trainer is at version {trainer.version}, step {recorded.version} "
                              f"was trained at {recorded.learner_version}")
        state = recorded.generator_state
        if generator_state(trainer.generator) != state:
            self.rng_mismatches += 1
            trainer.generator.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))
        return trainer.step(recorded.batch)


def trainer_at(run_dir: str | Path, version: int, overrides: list[str] | None = None) -> Trainer:
    """A one-process Trainer holding the state the run's learner had after step `version` (before it, the
    starting state, for version 0 or the first incarnation's start): from the newest checkpoint at or before it
    that no lost step separates from it (or the run's start), retrained on the recorded steps in between.
    Bit for bit what the run held where the run had one rank; within float rounding of it where it had more."""
    record = open_record(run_dir)
    start = start_of(record)
    lost_before = [v for v in record.lost() if v <= version]
    usable = [(v, p) for v, p in run_checkpoints(Path(run_dir)).items()
              if start.version <= v <= version and all(v >= lost for lost in lost_before)]
    if usable:
        start = Start(*max(usable))
    elif lost_before:
        raise RecordError(f"step {lost_before[-1]} is lost and no checkpoint after it reaches version {version}")
    first = record.steps(start.version + 1, version)
    cfg = (record.incarnation_of(version) if version > record.first().start_version else record.first()).config(
        overrides)
    set_torch_threads(cfg.learner)
    stepper = Stepper(build(cfg, start))
    for recorded in first:
        stepper.step(recorded)
    return stepper.trainer
