"""The one place a Trainer is saved to a checkpoint and restored from one. The format it writes is its parallel
strategy's (`checkpoint_format`, learner/checkpoint/formats.py): sharded (learner/checkpoint/sharded.py) where
learner.parallel is fsdp2, whatever the number of ranks, else a single file (learner/checkpoint/single_file.py).
A checkpoint of either format restores into any learner."""
from __future__ import annotations

from pathlib import Path

from turnstream.learner.checkpoint import sharded
from turnstream.learner.checkpoint.layout import read_state
from turnstream.learner.checkpoint.trainer_state import load_file_state


def writes_sharded(trainer) -> bool:
    """Whether `trainer` writes sharded checkpoints (then saving is a collective: every rank calls `save`)."""
    return trainer.parallel.checkpoint_format.collective


def save(root: Path, trainer, source_model_dir: str | Path, keep: int, tmp: str | None = None) -> Path | None:
    """The current version's checkpoint under `root`; returns its directory (rank 0), None on the other ranks.
    `tmp`: sharded only, the temporary directory every rank writes into (rank 0 picks it, tmp_name)."""
    return trainer.parallel.checkpoint_format.save(root, trainer, source_model_dir, keep, tmp)


def restore(path: Path, trainer) -> None:
    """Everything `path` holds besides a single file's policy weights (which the model was built from: its
    model/ directory) into `trainer`; a sharded checkpoint's weights too (a collective)."""
    if sharded.is_sharded(path):
        sharded.load(path, trainer)
    else:
        load_file_state(trainer, *read_state(path))
