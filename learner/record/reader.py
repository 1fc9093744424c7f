"""Reading a run's record back (format.py has the files): `open_record(run_dir)`.

    record = open_record("runs/demo")
    for step in record.steps():          # the run's lineage, in version order, lost steps included
        if step.lost:
            continue
        batch = step.batch               # protocol.messages.Batch, exactly as the buffer served it
        step.version, step.learner_version, step.request_id, step.generator_state

Which step counts for a version: a restarted learner resumes from its latest checkpoint and retrains the versions
after it, so a version may have been trained by two incarnations. The lineage is what the run's checkpoints and
final weights descend from: incarnation i owns the versions (start_i, bound_i], bound_i being the smallest start
of any later incarnation (the checkpoint it resumed from), or for the last one the newest version it recorded or
checkpointed. Its steps past bound_i are superseded (`Record.superseded()`); a version in its range without a
step file is lost (`RecordedStep.lost`): a step the learner took but whose record it could not write.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterator

from turnstream.core.config import Config
from turnstream.core.configtools import apply_override, from_dict
from turnstream.learner.record.format import (START_FILE, RecordError, incarnation_index, read_file, record_dir,
                                              unpack_frames, version_of_file)
from turnstream.protocol.codec import DecodeError, decode
from turnstream.protocol.messages import Batch

__all__ = ["Incarnation", "Record", "RecordError", "RecordedStep", "open_record"]


@dataclass(frozen=True)
class Incarnation:
    """One start of the learner process (the first, or a restart)."""
    index: int
    path: Path
    start_version: int  # the policy version it started from (0, or the checkpoint it resumed)
    resumed_from: str  # that checkpoint's directory; "" when it started from model.path
    world: int  # data-parallel ranks; each trained its share of every batch (learner/step/packing.py shard)
    parallel: str  # learner.parallel: ddp or fsdp2
    seed: int  # run.seed
    started: float  # unix time
    config_toml: str  # the configuration it ran with (Config.dumps())

    def config(self, overrides: list[str] | None = None) -> Config:
        """The configuration it ran with, with `SECTION.KEY=VALUE` overrides applied."""
        data = tomllib.loads(self.config_toml)
        for item in overrides or []:
            apply_override(data, item)
        return from_dict(Config, data)


class RecordedStep:
    """The step that produced policy `version` (step N: version N, as checkpoints/step-00000N names it)."""

    def __init__(self, version: int, incarnation: Incarnation, path: Path | None, superseded: bool = False):
        self.version = version
        self.incarnation = incarnation
        self.path = path  # None: lost
        self.superseded = superseded  # a later incarnation retrained this version

    @property
    def lost(self) -> bool:
        """The learner took this step, but its file could not be written: what it trained on is unknown."""
        return self.path is None

    @property
    def learner_version(self) -> int:
        """The learner's version when it trained (the version it asked the buffer for); version - 1."""
        return self.version - 1

    @cached_property
    def _entry(self) -> dict:
        if self.path is None:
            raise RecordError(f"step {self.version} is lost: the learner took it but could not record it")
        return read_file(self.path)

    @property
    def request_id(self) -> int:
        """The id of the batch request the buffer answered with this batch."""
        return int(self._entry["request_id"])

    @property
    def time(self) -> float:
        """Unix time the step finished."""
        return float(self._entry["time"])

    @property
    def step_s(self) -> float:
        return float(self._entry["step_s"])

    @property
    def generator_state(self) -> bytes:
        """torch.Generator.get_state() of the Trainer's generator before the step: the only random numbers a step
        draws (the minibatch permutation and step_kl's episode subset, learner/step/trainer.py); restore with
        `generator.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))`."""
        return self._entry["rng"]["generator"]

    @property
    def seed(self) -> int:
        return self.incarnation.seed

    @cached_property
    def batch(self) -> Batch:
        """The Batch exactly as the buffer served it (the order of its episodes is the order it trained them in)."""
        entry = self._entry
        try:
            msg = decode(unpack_frames(entry["batch"], entry["zlib"]), max_bytes=1 << 40)
        except DecodeError as exc:
            raise RecordError(f"record file {self.path}: its batch does not decode ({exc})") from None
        if not isinstance(msg, Batch):
            raise RecordError(f"record file {self.path} holds a {type(msg).__name__}, not a Batch")
        return msg

    def __repr__(self) -> str:
        state = "lost" if self.lost else "superseded" if self.superseded else "recorded"
        return f"RecordedStep(version={self.version}, incarnation={self.incarnation.index}, {state})"


class Record:
    """A run's recorded steps (see the module docstring for which one counts for a version)."""

    def __init__(self, run_dir: Path, incarnations: list[Incarnation], lineage: dict[int, RecordedStep],
                 superseded: list[RecordedStep]):
        self.run_dir = run_dir
        self.incarnations = incarnations
        self._lineage = lineage
        self._superseded = superseded

    def steps(self, first: int = 1, last: int | None = None) -> Iterator[RecordedStep]:
        """The lineage's steps with first <= version <= last, in version order, lost ones included."""
        for version in sorted(self._lineage):
            if version >= first and (last is None or version <= last):
                yield self._lineage[version]

    def step(self, version: int) -> RecordedStep:
        try:
            return self._lineage[version]
        except KeyError:
            raise RecordError(f"the record of {self.run_dir} holds no step {version} (it holds "
                              f"{self.describe_range()})") from None

    @property
    def versions(self) -> list[int]:
        return sorted(self._lineage)

    def lost(self) -> list[int]:
        return [v for v, s in sorted(self._lineage.items()) if s.lost]

    def superseded(self) -> list[RecordedStep]:
        """Steps a restarted learner trained again from an earlier checkpoint (not part of the lineage)."""
        return list(self._superseded)

    def first(self) -> Incarnation:
        """The incarnation the run started with: its start is where a full replay begins."""
        return self.incarnations[0]

    def incarnation_of(self, version: int) -> Incarnation:
        return self.step(version).incarnation

    def describe_range(self) -> str:
        v = self.versions
        return f"steps {v[0]}..{v[-1]}" if v else "no steps"


def open_record(run_dir: str | Path) -> Record:
    """The record of the run in `run_dir`; RecordError when it has none (learner.record was off)."""
    run_dir = Path(run_dir)
    root = record_dir(run_dir)
    paths = sorted(p for p in root.glob("learner-*") if (p / START_FILE).is_file()) if root.is_dir() else []
    if not paths:
        raise RecordError(f"{run_dir} holds no learner record ({root}): run with learner.record = true")
    incarnations = [_incarnation(p) for p in paths]
    newest_checkpoint = _newest_checkpoint(run_dir)
    lineage: dict[int, RecordedStep] = {}
    superseded: list[RecordedStep] = []
    for i, inc in enumerate(incarnations):
        steps = {version_of_file(p.name): p for p in inc.path.glob("step-*.msgpack")}
        lost = {version_of_file(p.name) for p in inc.path.glob("lost-*.msgpack")}
        later = [other.start_version for other in incarnations[i + 1:]]
        if later:  # a later incarnation resumed from a checkpoint this one (or an earlier one) wrote
            bound = min(later)
        else:  # the last: up to its newest step, or a checkpoint newer than that (written after a lost step)
            bound = max([inc.start_version, *steps, *lost, newest_checkpoint])
        for version in range(inc.start_version + 1, bound + 1):
            lineage[version] = RecordedStep(version, inc, steps.get(version))
        superseded += [RecordedStep(v, inc, p, superseded=True) for v, p in sorted(steps.items()) if v > bound]
    return Record(run_dir, incarnations, lineage, superseded)


def _incarnation(path: Path) -> Incarnation:
    e = read_file(path / START_FILE)
    return Incarnation(index=incarnation_index(path), path=path, start_version=int(e["start_version"]),
                       resumed_from=e["resumed_from"], world=int(e["world"]), parallel=e["parallel"],
                       seed=int(e["seed"]), started=float(e["time"]), config_toml=e["config"])


def _newest_checkpoint(run_dir: Path) -> int:
    done = [p for p in (run_dir / "checkpoints").glob("step-*") if (p / "trainer.pt").is_file()]
    return max((int(p.name.split("-", 1)[1]) for p in done), default=0)

