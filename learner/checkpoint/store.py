"""The one place a Trainer is saved to a checkpoint and restored from one, in either format: sharded
(learner/checkpoint/sharded.py) where learner.parallel is fsdp2, whatever the number of ranks, else a single
file (learner/checkpoint/single_file.py). A checkpoint of either format restores into any learner."""
from __future__ import annotations

import os
from pathlib import Path

from turnstream.learner.checkpoint import sharded, single_file
from turnstream.learner.checkpoint.layout import read_state, tmp_name
from turnstream.learner.checkpoint.trainer_state import file_state, load_file_state


def writes_sharded(trainer) -> bool:
    """Whether `trainer` writes sharded checkpoints (then saving is a collective: every rank calls `save`)."""
    return trainer.cfg.parallel == "fsdp2"


def save(root: Path, trainer, source_model_dir: str | Path, keep: int, tmp: str | None = None) -> Path | None:
    """The current version's checkpoint under `root`; returns its directory (rank 0), None on the other ranks.
    `tmp`: sharded only, the temporary directory every rank writes into (rank 0 picks it, tmp_name)."""
    if writes_sharded(trainer):
        return sharded.save(root, trainer, source_model_dir, trainer.tracker.state_dict(), keep,
                            tmp or tmp_name(trainer.version, os.getpid()))
    return single_file.save(root, trainer.version, trainer.net.model, source_model_dir, file_state(trainer),
                            trainer.tracker.state_dict(), keep)


def restore(path: Path, trainer) -> None:
    """Everything `path` holds besides a single file's policy weights (which the model was built from: its
    model/ directory) into `trainer`; a sharded checkpoint's weights too (a collective)."""
    if sharded.is_sharded(path):
        sharded.load(path, trainer)
    else:
        load_file_state(trainer, *read_state(path))
