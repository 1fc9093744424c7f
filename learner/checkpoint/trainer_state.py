"""What a checkpoint holds of a Trainer besides the policy's weights, and how it goes back in: version,
scheduler, RNG states and tracker in both formats; AdamW and the critic by parameter index in a single file
(learner/checkpoint/single_file.py), or keyed by name, each rank's shards, in a sharded one
(learner/checkpoint/sharded.py). The Trainer's parallel strategy (learner/parallel/) puts a single file's state
into a sharded network."""
from __future__ import annotations

import logging
import random

import numpy as np
import torch

log = logging.getLogger("turnstream.learner")


def rng_state(generator: torch.Generator) -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
            "generator": generator.get_state()}


def set_rng_state(state: dict, generator: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    generator.set_state(state["generator"])


def meta_state(trainer) -> dict:
    """What every checkpoint holds besides tensors: version, scheduler, RNG, the writer's parallel mode."""
    return {"version": trainer.version, "scheduler": trainer.scheduler.state_dict(),
            "rng": rng_state(trainer.generator), "parallel": trainer.cfg.parallel}


def file_state(trainer) -> dict:
    """A single-file checkpoint's trainer.pt (ddp and one process): optimizer by parameter index, critic, meta."""
    return {**meta_state(trainer), "optimizer": trainer.parallel.file_optimizer_state(trainer.optimizer),
            "critic": trainer.net.critic_state_dict()}


def load_file_state(trainer, state: dict, tracker_state: dict) -> None:
    """A single-file checkpoint's state; its weights came with the model (its model/ directory)."""
    if state["optimizer"] is None:
        log.warning("the checkpoint holds no optimizer state: AdamW starts its moments afresh")
    else:
        trainer.parallel.load_optimizer_state(trainer.net, trainer.optimizer, state["optimizer"])
    trainer.parallel.load_critic_state(trainer.net, state["critic"])
    _load_meta(trainer, state, tracker_state)


def sharded_state(trainer) -> dict:
    """Policy, critic and AdamW state as torch.distributed.checkpoint saves and loads them: each rank's shards
    under fsdp2 (a collective), the plain tensors otherwise; keyed by parameter name, so a checkpoint written on
    N ranks loads on M."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    return {"net": get_model_state_dict(trainer.net),
            "optimizer": get_optimizer_state_dict(trainer.net, trainer.optimizer)}


def load_sharded_state(trainer, state: dict, meta: dict, tracker_state: dict) -> None:
    """`state`: sharded_state()'s structure, filled by torch.distributed.checkpoint.load."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    set_model_state_dict(trainer.net, state["net"])
    set_optimizer_state_dict(trainer.net, trainer.optimizer, state["optimizer"])
    _load_meta(trainer, meta, tracker_state)


def _load_meta(trainer, meta: dict, tracker_state: dict) -> None:
    trainer.version = int(meta["version"])
    trainer.scheduler.load_state_dict(meta["scheduler"])
    set_rng_state(meta["rng"], trainer.generator)
    trainer.estimator.load_state_dict(tracker_state)
