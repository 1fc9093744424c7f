"""The learner's side of the record (rank 0): a start file when the learner starts, a step file after each step
(format.py has the files and the durability argument).

Every rank trains the same batch (rank 0 broadcasts it) and takes its share of the micro-batches by a rule of the
batch and the number of ranks alone (learner/step/packing.py `shard`), so rank 0's record of the batch, with the
number of ranks in the start file, is what every rank trained.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from turnstream.core.config import Config
from turnstream.learner.record.format import (START_FILE, incarnation_dir, incarnation_index, lost_file,
                                              pack_frames, record_dir, step_file, write_file)
from turnstream.protocol.codec import encode
from turnstream.protocol.messages import Batch

log = logging.getLogger("turnstream.learner")


def generator_state(generator: torch.Generator) -> bytes:
    """The state of the Trainer's generator, the only random numbers a step draws (learner/step/trainer.py)."""
    return generator.get_state().numpy().tobytes()


@dataclass
class WrittenStep:
    version: int
    bytes: int  # 0: lost
    seconds: float


class StepRecorder:
    """Writes one incarnation's files; `write_step` never raises (a step that cannot be recorded is lost, and the
    learner keeps training)."""

    def __init__(self, directory: Path, compress: bool = True):
        self.directory, self.compress = directory, compress

    @classmethod
    def start(cls, cfg: Config, start_version: int, world: int, resumed_from: Path | None) -> StepRecorder:
        """A new incarnation directory after the run's existing ones, and its start file."""
        root = record_dir(cfg.run.run_dir)
        root.mkdir(parents=True, exist_ok=True)
        index = max((incarnation_index(p) + 1 for p in root.glob("learner-*")), default=0)
        directory = incarnation_dir(cfg.run.run_dir, index)
        directory.mkdir()
        write_file(directory / START_FILE, {
            "kind": "start", "start_version": start_version, "resumed_from": str(resumed_from or ""), "world": world,
            "parallel": cfg.learner.parallel, "seed": cfg.run.seed, "time": time.time(), "config": cfg.dumps()})
        log.info("recording every step's batch in %s", directory)
        return cls(directory)

    def write_step(self, version: int, batch: Batch, generator_before: bytes, step_s: float) -> WrittenStep:
        """The step that produced `version` from `batch`, the generator's state before it drew."""
        started = time.monotonic()
        entry = {"kind": "step", "version": version, "request_id": batch.request_id, "time": time.time(),
                 "step_s": step_s, "rng": {"generator": generator_before}, "zlib": self.compress,
                 "batch": pack_frames(encode(batch), self.compress)}
        try:
            written = write_file(self.directory / step_file(version), entry)
        except OSError as exc:
            log.error("step %d is lost from the record: %s", version, exc)
            self._mark_lost(version, str(exc))
            written = 0
        return WrittenStep(version, written, time.monotonic() - started)

    def _mark_lost(self, version: int, reason: str) -> None:
        try:
            write_file(self.directory / lost_file(version), {"kind": "lost", "version": version, "reason": reason,
                                                            "time": time.time()})
        except OSError:  # the reader names the gap as lost all the same
            pass
