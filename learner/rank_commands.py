"""What rank 0 asks of the other ranks, in its order: a step (the Batch itself), a push's gathers, the forward of a
push's verification probe, a sharded checkpoint, stop (None). Each arrives through learner/parallel/ranks.py's broadcast, so every rank runs the
same collectives in the same order, whether rank 0 gathers a push before the next step (disk backend) or during
the push itself (nccl: the servers receive each bucket as it is gathered).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from turnstream.core.config import Config
from turnstream.learner.checkpoint import store
from turnstream.learner.checkpoint.layout import tmp_name
from turnstream.learner.parallel.ranks import broadcast
from turnstream.learner.weights.buckets import WeightBuckets
from turnstream.learner.sync.probe import model_logprobs
from turnstream.learner.weights.files import write_files

log = logging.getLogger("turnstream.learner")


@dataclass(frozen=True)
class Push:
    dtype: torch.dtype
    bucket_bytes: int
    directory: Path | None = None  # disk: every rank writes its rows of the bucket files there; None: gathers


@dataclass(frozen=True)
class Probe:
    tokens: tuple[int, ...]  # the verification probe (learner/sync/probe.py): a forward of it on every rank
    dtype: torch.dtype


@dataclass(frozen=True)
class Checkpoint:
    tmp: str  # the temporary directory rank 0 picked: every rank writes its shards there


def bucket_bytes(cfg: Config) -> int:
    return cfg.learner.push_bucket_mb << 20


def push_source(cfg: Config, trainer, dtype: torch.dtype) -> WeightBuckets:
    """Rank 0's weights for a push. Where reading them is a collective, reading or writing them first tells the
    other ranks to join in."""
    size = bucket_bytes(cfg)

    def announce(directory: Path | None) -> None:
        broadcast(Push(dtype, size, directory), 0, trainer.world)

    return trainer.weight_buckets(dtype, size, announce)


def probe_logprobs(trainer, tokens: tuple[int, ...], dtype: torch.dtype) -> list[float]:
    """Rank 0: the policy's log-probs of a push's verification probe, from the weights just pushed (called before
    the next step changes them). Sharded, the forward gathers layers: the other ranks are told to join."""
    if trainer.parallel.collective_push:
        broadcast(Probe(tokens, dtype), 0, trainer.world)
    return model_logprobs(trainer.net, tokens, dtype, trainer.device)


def checkpoints_dir(cfg: Config) -> Path:
    return Path(cfg.run.run_dir) / "checkpoints"


def save_checkpoint(cfg: Config, trainer) -> Path:
    """Rank 0: the current version's checkpoint; a sharded one is written by every rank, told to join here."""
    tmp = None
    if store.writes_sharded(trainer):
        tmp = tmp_name(trainer.version, os.getpid())
        broadcast(Checkpoint(tmp), 0, trainer.world)
    return store.save(checkpoints_dir(cfg), trainer, cfg.model.path, cfg.learner.keep_checkpoints, tmp)


def follow(cfg: Config, trainer) -> None:
    """Ranks above 0: do what rank 0 broadcasts until it says stop."""
    rank, world = trainer.rank, trainer.world
    while (order := broadcast(None, rank, world)) is not None:
        if isinstance(order, Push) and order.directory is not None:
            write_files(order.directory, trainer.weight_buckets(order.dtype, order.bucket_bytes))
        elif isinstance(order, Push):
            trainer.weight_buckets(order.dtype, order.bucket_bytes).finish()
        elif isinstance(order, Probe):
            model_logprobs(trainer.net, order.tokens, order.dtype, trainer.device)
        elif isinstance(order, Checkpoint):
            store.save(checkpoints_dir(cfg), trainer, cfg.model.path, cfg.learner.keep_checkpoints, order.tmp)
        else:
            try:
                trainer.step(order)
            except ValueError as exc:  # rank 0 skips the same batch for the same reason
                log.error("rank %d skipped a batch: %s", rank, exc)
