"""`turnstream learner`: request batches, train, push weights, announce versions.

Every rank builds the model and a Trainer; rank 0 talks to the buffer and the servers (learner/serve.py) and
hands each batch to the other ranks, which step on it alongside (learner/parallel/ranks.py); under fsdp2 it also
tells them when to join a push's gathers and a sharded checkpoint (learner/rank_commands.py)."""
from __future__ import annotations

import asyncio
import gc
import logging
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from turnstream.core.config import Config
from turnstream.core.configtools import ConfigError
from turnstream.learner import lora
from turnstream.learner.checkpoint import sharded, store
from turnstream.learner.checkpoint.layout import latest
from turnstream.learner.device import attn_implementation, placement, set_torch_threads
from turnstream.learner.parallel.ranks import broadcast, init_from_env, shutdown
from turnstream.learner.rank_commands import follow
from turnstream.learner.scale_defaults import resolved_settings
from turnstream.learner.serve import serve
from turnstream.learner.step.trainer import Trainer

__all__ = ["build_trainer", "main", "start_rank", "train"]

log = logging.getLogger("turnstream.learner")


def build_trainer(cfg: Config, rank: int = 0, world: int = 1, checkpoint: Path | None = None):
    """Model, optional reference model and critic, Trainer; restored from `checkpoint` (`turnstream replay`), else
    from the latest checkpoint if asked (rank 0 picks it, every rank loads it). A sharded checkpoint
    (learner/checkpoint/sharded.py) loads on any number of ranks; a single-file one into ddp and one-process
    learners (learner/checkpoint/store.py)."""
    lc = cfg.learner
    where = placement(lc.device, lc.precision)
    resume_from = checkpoint
    if checkpoint is None:
        resume_from = latest(Path(cfg.run.run_dir) / "checkpoints") if lc.resume and rank == 0 else None
        resume_from = broadcast(resume_from, rank, world)
    sharded_checkpoint = resume_from is not None and sharded.is_sharded(resume_from)
    # a sharded checkpoint's weights are filled into the model after it is built (and sharded); with LoRA the
    # base is model.path's, frozen, and a single-file checkpoint's model/ holds the adapter (learner/lora.py)
    plain_checkpoint = resume_from / "model" if resume_from and not sharded_checkpoint else None
    model_dir = plain_checkpoint if plain_checkpoint and lc.lora is None else cfg.model.path
    attn = attn_implementation(lc.attn_implementation, where.device)
    kw = {"attn_implementation": attn} if attn else {}
    if sharded_checkpoint:  # every weight comes from the shards: model.path's are not read
        model = sharded.model_to_fill(cfg.model.path, **kw)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **kw)
    model = lora.attach(model, lc.lora, plain_checkpoint)
    ref = None
    if lc.kl_coef > 0:  # the KL anchors to the initial policy, also after a resume
        # frozen and never stepped: held in the compute dtype (bf16 on cuda), half the memory of fp32
        ref = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=where.compute_dtype or torch.float32,
                                                   **kw).eval()
        ref.requires_grad_(False)
    trainer = Trainer(model, lc, seed=cfg.run.seed, critic_path=lc.critic.path or cfg.model.path, ref_model=ref,
                      where=where, longest_context=cfg.vllm.max_model_len)
    log.info("learner on %s, %s, attention %s, activation checkpointing %s", where.device, where.precision,
             model.config._attn_implementation, lc.activation_checkpointing)
    if chosen := resolved_settings(lc, trainer.cfg):
        log.info("for a policy of %d parameters, auto settings: %s", trainer.policy_parameters, chosen)
    if resume_from:
        store.restore(resume_from, trainer)
        log.info("resumed from %s at version %d", resume_from, trainer.version)
    return model, trainer, resume_from


def start_rank(cfg: Config) -> tuple[int, int]:
    """This process's threads, seed (the critic's initial weights draw from it) and place among the ranks."""
    set_torch_threads(cfg.learner)
    torch.manual_seed(cfg.run.seed)
    return init_from_env(cfg.learner.device)


async def train(cfg: Config) -> None:
    rank, world = start_rank(cfg)
    try:
        await _train_rank(cfg, rank, world)
    finally:
        # The trainer (gone with _train_rank's frame) must be freed before the process group is destroyed:
        # DDP's reducer holds the group, and its last reference dropped later runs gloo's destructor with the
        # GIL held while gloo's worker thread waits for the GIL to free its last work, a deadlock at exit.
        gc.collect()
        shutdown(world)


async def _train_rank(cfg: Config, rank: int, world: int) -> None:
    _, trainer, resumed_from = build_trainer(cfg, rank, world)
    if rank == 0:
        await serve(cfg, trainer, world, resumed_from)
    else:
        follow(cfg, trainer)  # steps, push gathers and checkpoints, as rank 0 orders them


def main(cfg: Config) -> None:
    if not cfg.vllm.urls:
        raise ConfigError("vllm.urls: the learner needs at least one vLLM server URL to push weights to")
    asyncio.run(train(cfg))
