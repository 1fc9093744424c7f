"""How a checkpoint of a Trainer's weights and optimizer is written: the interface, and its two formats. The
Trainer's parallel strategy holds one (learner/parallel/choose.py picks it with the strategy), so nothing else
asks which strategy a learner runs. Reading needs no choice: a checkpoint says its own format
(sharded.is_sharded), and either restores into any learner (learner/checkpoint/store.py)."""
from __future__ import annotations

import os
from abc import ABC, abstractmethod
from pathlib import Path

from turnstream.learner.checkpoint import sharded, single_file
from turnstream.learner.checkpoint.layout import tmp_name
from turnstream.learner.checkpoint.trainer_state import file_state


class CheckpointFormat(ABC):
    # whether every rank writes its part (then `save` is a collective, called on every rank)
    collective = False

    @abstractmethod
    def save(self, root: Path, trainer, source_model_dir: str | Path, keep: int, tmp: str | None) -> Path | None:
        """The current version's checkpoint under `root`; its directory on rank 0, None on the other ranks.
        `tmp`: the temporary directory every rank writes into, where the format is a collective."""


class SingleFile(CheckpointFormat):
    """Rank 0 writes the whole policy with save_pretrained and the rest in trainer.pt (single_file.py)."""

    def save(self, root: Path, trainer, source_model_dir: str | Path, keep: int, tmp: str | None) -> Path | None:
        return single_file.save(root, trainer.version, trainer.net.model, source_model_dir, file_state(trainer),
                                trainer.estimator.state_dict(), keep)


class Sharded(CheckpointFormat):
    """Every rank writes its shards with torch.distributed.checkpoint (sharded.py)."""

    collective = True

    def save(self, root: Path, trainer, source_model_dir: str | Path, keep: int, tmp: str | None) -> Path | None:
        return sharded.save(root, trainer, source_model_dir, trainer.estimator.state_dict(), keep,
                            tmp or tmp_name(trainer.version, os.getpid()))
