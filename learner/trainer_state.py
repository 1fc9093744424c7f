"""The Trainer's state as pushes and checkpoints read it (a mixin of learner/trainer.py's Trainer): the policy's
weights bucket by bucket for a push, and the state of a checkpoint, single-file (ddp, one process;
learner/checkpoint.py) or sharded (fsdp2; learner/checkpoint_dcp.py)."""
from __future__ import annotations

import logging

import torch

from turnstream.learner.checkpoint import rng_state, set_rng_state
from turnstream.learner.fsdp import load_full_optimizer_state_dict, load_full_state_dict
from turnstream.learner.lora import push_tensors
from turnstream.learner.weight_sync_buckets import WeightBuckets, policy_tensors

log = logging.getLogger("turnstream.learner")


class TrainerState:
    """Reads the Trainer's net, optimizer, scheduler, generator, tracker, version, cfg and sharded flag."""

    def weight_buckets(self, dtype: torch.dtype | None, bucket_bytes: int, announce=None) -> WeightBuckets:
        """The policy's weights for a push, cast to `dtype`, gathered bucket by bucket (learner/weight_sync_buckets.py);
        sharded, every rank must read it (rank 0 hands it to the backend, the others `finish()` it). With
        learner.lora: the adapters alone, or the merged weights (learner/lora.py, push_tensors)."""
        lora, tensors = self.cfg.lora, policy_tensors(self.net.model)
        if announce is None or lora is None or lora.push == "adapter":
            return WeightBuckets(push_tensors(tensors, lora), dtype, bucket_bytes, announce)
        # A merged LoRA push on sharded rank 0: merging shards takes collectives, so the other ranks are told to
        # join first, as in a gathered push (they merge the same way, then gather along); the merged weights are
        # gathered here whole, and the backend reads them as it reads unsharded weights.
        announce(None)
        merged = WeightBuckets(push_tensors(tensors, lora), dtype, bucket_bytes)
        return WeightBuckets(dict(merged.items()), dtype, bucket_bytes)

    def _critic_module(self) -> torch.nn.Module | None:
        return self.net.head if self.net.head is not None else self.net.critic

    def meta_state(self) -> dict:
        """What every checkpoint holds besides tensors: version, scheduler, RNG, the writer's parallel mode."""
        return {"version": self.version, "scheduler": self.scheduler.state_dict(), "rng": rng_state(self.generator),
                "parallel": self.cfg.parallel}

    def sharded_state(self) -> dict:
        """Policy, critic and AdamW state as torch.distributed.checkpoint saves and loads them: each rank's shards
        under fsdp2 (a collective), the plain tensors otherwise; keyed by parameter name, so a checkpoint
        written on N ranks loads on M."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        return {"net": get_model_state_dict(self.net), "optimizer": get_optimizer_state_dict(self.net, self.optimizer)}

    def load_sharded_state(self, state: dict, meta: dict, tracker_state: dict) -> None:
        """`state`: sharded_state()'s structure, filled by torch.distributed.checkpoint.load."""
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        set_model_state_dict(self.net, state["net"])
        set_optimizer_state_dict(self.net, self.optimizer, state["optimizer"])
        self._load_meta(meta, tracker_state)

    def state_dict(self) -> dict:
        """Today's single-file state (ddp and one process): optimizer by parameter index, critic, meta."""
        if self.sharded:
            raise RuntimeError("fsdp2 state is sharded: write it with learner/checkpoint_dcp.py (sharded_state)")
        return {**self.meta_state(), "optimizer": self.optimizer.state_dict(), "critic": self.net.critic_state_dict()}

    def load_state_dict(self, state: dict, tracker_state: dict) -> None:
        """A single-file checkpoint's state; its weights came with the model (its model/ directory)."""
        if state["optimizer"] is None:
            log.warning("the checkpoint holds no optimizer state: AdamW starts its moments afresh")
        elif self.sharded:
            self._scatter_optimizer_state(state["optimizer"])
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        critic = self._critic_module()
        if critic is not None and state["critic"] and self.sharded:  # each rank keeps its shards
            load_full_state_dict(critic, state["critic"])
        elif not self.sharded:
            self.net.load_critic_state_dict(state["critic"] or {})
        self._load_meta(state, tracker_state)

    def _scatter_optimizer_state(self, saved: dict) -> None:
        """fsdp2 from a ddp or one-process checkpoint (every rank read it): AdamW's state, kept there by parameter
        index, is keyed by name (both learners build their parameter groups in the same order), and each rank
        keeps its shards of it."""
        names = {id(p): n for n, p in self.net.named_parameters()}
        order = [names[id(p)] for p in self._params()]
        named = {"state": {order[int(i)]: s for i, s in saved["state"].items()},
                 "param_groups": [{**g, "params": [order[int(i)] for i in g["params"]]} for g in saved["param_groups"]]}
        load_full_optimizer_state_dict(self.net, self.optimizer, named)

    def _load_meta(self, meta: dict, tracker_state: dict) -> None:
        self.version = int(meta["version"])
        self.scheduler.load_state_dict(meta["scheduler"])
        set_rng_state(meta["rng"], self.generator)
        self.tracker.load_state_dict(tracker_state)
