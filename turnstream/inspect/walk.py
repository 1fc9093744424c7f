"""A recorded run's learner at the versions asked for, in ascending order: rebuilt once from the record
(turnstream/replay/rebuild.py trainer_at: the nearest checkpoint below, then the recorded steps), then stepped on
through the record; rebuilt again only to go back, or past a lost step."""
from __future__ import annotations

from pathlib import Path

from turnstream.core.config import Config
from turnstream.learner.record.reader import open_record
from turnstream.replay.rebuild import Stepper, trainer_at


class LearnerWalk:
    def __init__(self, run_dir: str | Path, overrides: list[str] | None = None):
        self.run_dir = Path(run_dir)
        self.record = open_record(self.run_dir)
        self.overrides = overrides
        self._stepper: Stepper | None = None

    def config_at(self, version: int) -> Config:
        """The configuration of the learner that held `version`."""
        first = self.record.first()
        incarnation = self.record.incarnation_of(version) if version > first.start_version else first
        return incarnation.config(self.overrides)

    def at(self, version: int):
        """The Trainer holding the run's state after step `version` (the learner's version while it trained step
        `version + 1`). Raises RecordError where a lost step stands in the way."""
        s = self._stepper
        if s is None or s.trainer.version > version or any(s.trainer.version < v <= version
                                                           for v in self.record.lost()):
            self._stepper = s = Stepper(trainer_at(self.run_dir, version, self.overrides))
        for step in self.record.steps(s.trainer.version + 1, version):
            s.step(step)
        return s.trainer
