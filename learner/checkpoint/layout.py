"""Where checkpoints live and how one is published, whatever its format.

<run_dir>/checkpoints/step-000012/ holds a policy version's checkpoint: model/ (a Hugging Face directory, or its
side files alone when the weights are sharded), trainer.pt and tracker.json. A checkpoint directory exists under
its final name only once every file in it is complete (rename is atomic on one filesystem); a crash mid-write
leaves a `.tmp-*` directory that is ignored and removed. The newest `keep` checkpoints are kept.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from turnstream.core.fsutil import fsync_dir

WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth", ".index.json")  # an index names weight files


def final_name(version: int) -> str:
    return f"step-{version:06d}"


def tmp_name(version: int, pid: int) -> str:
    """The temporary directory a checkpoint is written into (for a sharded one, rank 0 picks it and tells the
    other ranks)."""
    return f".tmp-step-{version:06d}-{pid}"


def publish(tmp: Path, final: Path, source_model_dir: str | Path, trainer_state: dict, tracker_state: dict,
            keep: int) -> Path:
    """Complete `tmp` (the source model's side files, trainer.pt, tracker.json), make it durable, rename it to
    `final` and prune older checkpoints beyond `keep`."""
    copy_side_files(source_model_dir, tmp / "model")
    torch.save(trainer_state, tmp / "trainer.pt")
    (tmp / "tracker.json").write_text(json.dumps(tracker_state))
    for f in tmp.rglob("*"):  # make the bytes durable before the rename publishes them
        if f.is_file():
            with f.open("rb") as fh:
                os.fsync(fh.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    _prune(final.parent, keep)
    return final


def copy_side_files(source: str | Path, dest: Path) -> None:
    """Tokenizer, chat template, config, generation config: every file of `source` but weights, unless present."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in Path(source).iterdir():
        if f.is_file() and not f.name.endswith(WEIGHT_FILES) and not (dest / f.name).exists():
            shutil.copy2(f, dest / f.name)


def latest(root: Path) -> Path | None:
    root = Path(root)
    if not root.is_dir():
        return None
    for stale in root.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    done = sorted(p for p in root.glob("step-*") if (p / "trainer.pt").is_file())
    return done[-1] if done else None


def version_of(path: Path | None) -> int:
    """The policy version a checkpoint directory holds (step-000012: 12); -1 for none."""
    return int(Path(path).name.split("-", 1)[1]) if path is not None else -1


def read_state(path: Path) -> tuple[dict, dict]:
    """trainer.pt and tracker.json of a checkpoint."""
    trainer_state = torch.load(Path(path) / "trainer.pt", weights_only=False)  # our own file: numpy RNG state
    tracker_state = json.loads((Path(path) / "tracker.json").read_text())
    return trainer_state, tracker_state


def _prune(root: Path, keep: int) -> None:
    done = sorted(root.glob("step-*"))
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
