"""`turnstream learner`: request batches, train, push weights, announce versions.

Every rank builds the model and a Trainer; rank 0 talks to the buffer and the servers (learner/serve.py) and
hands each batch to the other ranks, which step on it alongside (learner/distributed.py)."""
from __future__ import annotations

import asyncio
import gc
import logging
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from turnstream.core.config import Config
from turnstream.core.configtools import ConfigError
from turnstream.learner import checkpoint
from turnstream.learner.device import attn_implementation, placement
from turnstream.learner.distributed import broadcast, init_from_env, shutdown
from turnstream.learner.serve import save_checkpoint, serve
from turnstream.learner.trainer import Trainer

__all__ = ["build_trainer", "main", "train"]

log = logging.getLogger("turnstream.learner")


def build_trainer(cfg: Config):
    """Model, optional reference model and critic, Trainer; resumed from the latest checkpoint if asked."""
    lc = cfg.learner
    where = placement(lc.device, lc.precision)
    resume_from = checkpoint.latest(Path(cfg.run.run_dir) / "checkpoints") if lc.resume else None
    model_dir = resume_from / "model" if resume_from else cfg.model.path
    attn = attn_implementation(lc.attn_implementation, where.device)
    kw = {"attn_implementation": attn} if attn else {}
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **kw)
    ref = None
    if lc.kl_coef > 0:  # the KL anchors to the initial policy, also after a resume
        # frozen and never stepped: held in the compute dtype (bf16 on cuda), half the memory of fp32
        ref = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=where.compute_dtype or torch.float32,
                                                   **kw).eval()
        ref.requires_grad_(False)
    trainer = Trainer(model, lc, seed=cfg.run.seed, critic_path=lc.critic.path or cfg.model.path, ref_model=ref,
                      where=where)
    log.info("learner on %s, %s, attention %s, activation checkpointing %s", where.device, where.precision,
             model.config._attn_implementation, lc.activation_checkpointing)
    if resume_from:
        trainer.load_state_dict(*checkpoint.load(resume_from))
        log.info("resumed from %s at version %d", resume_from, trainer.version)
    return model, trainer, resume_from


async def train(cfg: Config) -> None:
    lc = cfg.learner
    torch.set_num_threads(lc.torch_threads)
    torch.manual_seed(cfg.run.seed)
    rank, world = init_from_env(lc.device)
    try:
        await _train_rank(cfg, rank, world)
    finally:
        # The trainer (gone with _train_rank's frame) must be freed before the process group is destroyed:
        # DDP's reducer holds the group, and its last reference dropped later runs gloo's destructor with the
        # GIL held while gloo's worker thread waits for the GIL to free its last work, a deadlock at exit.
        gc.collect()
        shutdown(world)


async def _train_rank(cfg: Config, rank: int, world: int) -> None:
    model, trainer, _ = build_trainer(cfg)
    if rank == 0:
        await serve(cfg, model, trainer, world)
        await checkpoint_on_stop(cfg, model, trainer)
        return
    while (batch := broadcast(None, rank, world)) is not None:
        try:
            trainer.step(batch)
        except ValueError as exc:  # rank 0 skips the same batch for the same reason
            log.error("rank %d skipped a batch: %s", rank, exc)


async def checkpoint_on_stop(cfg: Config, model, trainer) -> None:
    """A stopped learner (SIGTERM, max_steps) leaves a checkpoint of its last step, so that a resumed run
    loses no step: serve() returns only after that step's push and announcement."""
    root = Path(cfg.run.run_dir) / "checkpoints"
    if trainer.version > 0 and checkpoint.version_of(checkpoint.latest(root)) < trainer.version:
        seconds = await save_checkpoint(cfg, model, trainer)
        log.info("checkpoint of version %d on stop (%.1f s)", trainer.version, seconds)


def main(cfg: Config) -> None:
    if not cfg.vllm.urls:
        raise ConfigError("vllm.urls: the learner needs at least one vLLM server URL to push weights to")
    asyncio.run(train(cfg))
