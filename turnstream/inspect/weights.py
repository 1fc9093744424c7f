"""The weights of a run's policy versions: the ones the run kept on disk, or rebuilt from its record.

A run keeps the starting weights (model.path, version 0), its newest pushed versions (learner.keep_weight_versions,
under learner.weights_dir or <run_dir>/weights) and its newest checkpoints (learner.keep_checkpoints). Any other
version is rebuilt by retraining the recorded steps up to it in one process (turnstream/replay/rebuild.py), which on
the CPU gives the run's own weights bit for bit where the run had one rank, within float rounding where it had more.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from turnstream.core.config import Config
from turnstream.learner.checkpoint.layout import final_name

log = logging.getLogger("turnstream.inspect")


@dataclass(frozen=True)
class VersionWeights:
    version: int
    path: Path  # a Hugging Face model directory
    source: str  # model.path, pushed weights, checkpoint or replay


def holds_weights(directory: Path) -> bool:
    return (directory / "config.json").is_file() and any(
        f.name.endswith((".safetensors", ".safetensors.index.json")) for f in directory.glob("*.safetensors*"))


def kept_weights(cfg: Config, run_dir: Path, version: int) -> VersionWeights | None:
    """Version `version`'s weights where the run kept them; None where it did not."""
    candidates = [(Path(cfg.learner.weights_dir or run_dir / "weights") / f"v{version:06d}", "pushed weights"),
                  (run_dir / "checkpoints" / final_name(version) / "model", "checkpoint")]
    if version == 0:
        candidates.insert(0, (Path(cfg.model.path), "model.path"))
    for path, source in candidates:
        if holds_weights(path):
            return VersionWeights(version, path.resolve(), source)
    return None


def replayed_weights(run_dir: Path, versions: list[int], into: Path, overrides: list[str] | None = None
                     ) -> dict[int, VersionWeights]:
    """`versions`' weights rebuilt from the run's record, written under `into` as the learner pushes them (one
    replay, stepping on from each version to the next)."""
    from turnstream.inspect.walk import LearnerWalk
    from turnstream.learner.device import served_dtype
    from turnstream.learner.rank_commands import push_source
    from turnstream.learner.sync.disk import DiskWeightSync

    walk = LearnerWalk(run_dir, overrides)
    out: dict[int, VersionWeights] = {}
    for version in sorted(versions):
        log.info("rebuilding the weights of version %d from the record", version)
        trainer, cfg = walk.at(version), walk.config_at(version)
        sync = DiskWeightSync([], into, cfg.model.path, keep=max(versions) + 1)  # prunes none of them
        path = sync.save(push_source(cfg, trainer, served_dtype(cfg.vllm.dtype, cfg.model.path)), version)
        out[version] = VersionWeights(version, path, "replay")
    return out
