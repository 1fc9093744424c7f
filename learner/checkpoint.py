"""Atomic checkpoints: HF model directory + trainer state, written to a temp dir and renamed into place.

Layout of <run_dir>/checkpoints/step-000012/:
  model/          save_pretrained (safetensors) + the source model's tokenizer files: loadable by
                  transformers and vLLM as is
  trainer.pt      optimizer, scheduler, critic, RNG states, policy version
  tracker.json    SPO tracker state (plain JSON, readable without torch)
A checkpoint directory exists under its final name only once every file in it is complete (rename is
atomic on one filesystem); a crash mid-write leaves a `.tmp-*` directory that is ignored and removed.

This is the format of ddp and one-process learners. An fsdp2 learner writes each rank's shards instead
(learner/checkpoint_dcp.py: `dcp/` in place of the weights, the same trainer.pt and tracker.json), which any
learner resumes from, on any number of ranks; `turnstream export` turns either into a Hugging Face directory.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from turnstream.core.fsutil import fsync_dir

WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth", ".index.json")  # an index names weight files


def rng_state(generator: torch.Generator) -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
            "generator": generator.get_state()}


def set_rng_state(state: dict, generator: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    generator.set_state(state["generator"])


def save(root: Path, version: int, model, source_model_dir: str | Path, trainer_state: dict, tracker_state: dict,
         keep: int = 2) -> Path:
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{version:06d}"
    tmp = root / f".tmp-step-{version:06d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp / "model", safe_serialization=True)
    return publish(tmp, final, source_model_dir, trainer_state, tracker_state, keep)


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


def load(path: Path) -> tuple[dict, dict]:
    trainer_state = torch.load(Path(path) / "trainer.pt", weights_only=False)  # our own file: numpy RNG state
    tracker_state = json.loads((Path(path) / "tracker.json").read_text())
    return trainer_state, tracker_state


def _prune(root: Path, keep: int) -> None:
    done = sorted(root.glob("step-*"))
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
