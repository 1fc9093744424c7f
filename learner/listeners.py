"""The learner loop's listeners (learner/events.py), and the one place that picks them from the config, at
start-up: the step record (learner.record), the audit trail (TURNSTREAM_AUDIT), the periodic checkpoints
(learner.checkpoint_every), then the metrics, the step's log line and the experiment trackers, always.

The order is the order they hear each event in, and it carries the loop's promises: a step's record and its
audit line come before its checkpoint, and the step's figures are measured before its line is written."""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from turnstream.core.audit import AuditLog, open_audit
from turnstream.core.config import Config
from turnstream.learner.events import (LearnerEvent, LearnerListener, LearnerStopped, Listeners, StepTrained,
                                       VersionPublished, VersionSaved)
from turnstream.learner.metrics import LearnerMetrics
from turnstream.learner.rank_commands import save_checkpoint as write_checkpoint
from turnstream.learner.record.writer import StepRecorder, WrittenStep
from turnstream.learner.step.trainer import Trainer
from turnstream.learner.trackers import Trackers

log = logging.getLogger("turnstream.learner")


@dataclass
class StepRecording:
    """learner.record: each step's record is written while its weights are saved, and is durable before the
    version is checkpointed, pushed or logged (learner/record/format.py)."""
    recorder: StepRecorder
    writing: asyncio.Task[WrittenStep] | None = None  # the step's record, on its way to disk

    async def on_event(self, event: LearnerEvent) -> dict[str, float]:
        if isinstance(event, StepTrained):
            self.writing = asyncio.create_task(asyncio.to_thread(
                self.recorder.write_step, event.version, event.batch, event.generator_before, event.stats["step_s"]))
        elif isinstance(event, VersionSaved) and self.writing is not None:
            waited = time.monotonic()  # record_wait_s: what recording adds to the step's critical path
            written, self.writing = await self.writing, None
            return {"record_bytes": written.bytes, "record_s": written.seconds,
                    "record_wait_s": time.monotonic() - waited}
        return {}


@dataclass
class StepAudit:
    """TURNSTREAM_AUDIT=1 (tests/fault/): a line per trained batch, before the step's checkpoint, so that a
    checkpointed step always has its line."""
    audit: AuditLog

    async def on_event(self, event: LearnerEvent) -> dict[str, float]:
        if isinstance(event, StepTrained):
            batch = event.batch
            self.audit.write({"version": event.version, "batch_version": batch.learner_version,
                              "episodes": list(batch.episode_ids), "prompt_keys": list(batch.prompt_keys),
                              "tokens": [int(n) for n in batch.episode_offsets[1:] - batch.episode_offsets[:-1]],
                              "staleness_max": event.stats["staleness_max"]})
        elif isinstance(event, LearnerStopped):
            self.audit.close()
        return {}


@dataclass
class PeriodicCheckpoints:
    """learner.checkpoint_every: a checkpoint of every version it divides, before the version is pushed."""
    cfg: Config
    trainer: Trainer

    async def on_event(self, event: LearnerEvent) -> dict[str, float]:
        if isinstance(event, VersionSaved) and event.version % self.cfg.learner.checkpoint_every == 0:
            return {"checkpoint_s": await save_checkpoint(self.cfg, self.trainer)}
        return {}


@dataclass
class StepMetrics:
    """The step's figures on /metrics, once its version is announced."""
    metrics: LearnerMetrics

    async def on_event(self, event: LearnerEvent) -> dict[str, float]:
        if isinstance(event, VersionPublished):
            stats = event.stats
            self.metrics.record(dict(stats))
            self.metrics.wait_seconds.observe(stats["wait_s"])
            if stats["push_s"] == stats["push_s"]:  # not NaN: the push went through
                self.metrics.push_seconds.observe(stats["push_s"])
        return {}


@dataclass
class StepLog:
    """The step's line in learner.jsonl (what `turnstream report` reads) and its summary in the log."""
    file: TextIO

    async def on_event(self, event: LearnerEvent) -> dict[str, float]:
        if isinstance(event, VersionPublished):
            stats = event.stats
            self.file.write(json.dumps(stats) + "\n")
            self.file.flush()
            log.info("step %d: return %.3f, loss %.4f, staleness max %d, step %.2fs, push %.2fs, wait %.2fs",
                     stats["version"], stats["return_mean"], stats["policy_loss"], stats["staleness_max"],
                     stats["step_s"], stats["push_s"], stats["wait_s"])
        elif isinstance(event, LearnerStopped):
            self.file.close()
        return {}


def listeners_for(cfg: Config, trainer: Trainer, world: int, resumed_from: Path | None, metrics: LearnerMetrics,
                  trackers: Trackers) -> Listeners:
    """The listeners the config asks for, in the order they hear each event."""
    run_dir = Path(cfg.run.run_dir)
    chosen: list[LearnerListener] = []
    if cfg.learner.record:
        chosen.append(StepRecording(StepRecorder.start(cfg, trainer.version, world, resumed_from)))
    audit = open_audit(run_dir, "learner")  # None unless TURNSTREAM_AUDIT=1 (tests/fault/)
    if audit is not None:
        chosen.append(StepAudit(audit))
    if cfg.learner.checkpoint_every:
        chosen.append(PeriodicCheckpoints(cfg, trainer))
    chosen += [StepMetrics(metrics), StepLog((run_dir / "learner.jsonl").open("a")), trackers]
    return Listeners(chosen)


async def save_checkpoint(cfg: Config, trainer: Trainer) -> float:
    """A checkpoint of the current version (learner/rank_commands.py picks the format); returns its seconds."""
    started = time.monotonic()
    await asyncio.to_thread(write_checkpoint, cfg, trainer)
    return time.monotonic() - started
