"""The parallel strategy of a Trainer: one process, DDP or FSDP2, chosen once when the Trainer is built
(`strategy_for`). It is everything that differs between them: where the network's parameters live, the network
that takes gradients, when gradients are reduced over ranks and how the loss is scaled for it, how many forwards
a rank runs, how the weights of a push are read, the format its checkpoints are written in, and how a
checkpoint's optimizer and critic state go back into the network.

Data parallel in every form: every rank holds the same batch and computes the same advantages; micro-batches
are dealt round-robin over ranks and gradients are summed across ranks. Because the loss carries batch-global
aggregation weights (learner/step/objective.py), the sum over micro-batches and ranks is exactly the one-rank loss.
"""
from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from turnstream.core.config_lora import LoraSection
from turnstream.learner.checkpoint.formats import CheckpointFormat
from turnstream.learner.device import Placement
from turnstream.learner.parallel.ranks import sum_over_ranks
from turnstream.learner.weights.buckets import WeightBuckets
from turnstream.learner.weights.source import push_source


class ParallelStrategy(ABC):
    """How the Trainer's network is placed, trained and read on `world` ranks (this one: `rank`)."""

    # whether reading a push's weights is a collective every rank joins (then it must not interleave with a step)
    collective_push = False

    def __init__(self, where: Placement, rank: int, world: int, checkpoint_format: CheckpointFormat):
        self.where, self.rank, self.world = where, rank, world
        self.checkpoint_format = checkpoint_format  # how its checkpoints are written (learner/checkpoint/formats.py)

    @property
    def device(self) -> torch.device:
        return self.where.device

    # ---- building the network -----------------------------------------------------------------------

    def place(self, module: nn.Module) -> nn.Module:
        """fp32 master weights on the learner's device (autocast does the rest)."""
        return module.to(self.device, dtype=torch.float32)

    @abstractmethod
    def prepare(self, net: nn.Module, ref_model: nn.Module | None, reshard_after_forward: bool) -> nn.Module:
        """Ready `net` (and the frozen reference model) for training; returns the network that takes gradients
        (forwards without gradients use `net` itself). Runs before the optimizer is built."""

    # ---- the step -----------------------------------------------------------------------------------

    def gradient_sync(self, train_net: nn.Module, last: bool) -> contextlib.AbstractContextManager:
        """The context of a micro-batch's forward and backward; `last`: the rank's last of this update."""
        return contextlib.nullcontext()

    def critic_gradient_sync(self, train_net: nn.Module, params: list[nn.Parameter],
                             last: bool) -> contextlib.AbstractContextManager:
        """The context of a micro-batch's forward and backward in a pass whose gradient reaches the critic's
        `params` alone (episodes served to the critic alone); `last`: the rank's last of the pass."""
        return self.gradient_sync(train_net, last)

    def backward(self, loss: torch.Tensor, own: bool) -> None:
        """The backward of a micro-batch's loss; `own`: the micro-batch is this rank's share, not the stand-in of
        an idle rank (which adds no gradient). The reduction over ranks averages the gradients (DDP's all-reduce,
        FSDP2's reduce-scatter), while the loss's aggregation weights already divide by the global count
        (learner/step/objective.py): the loss is scaled by the number of ranks to undo the average."""
        (loss * (self.world if own else 0.0)).backward()

    def forwards(self, groups: int, mine: int) -> int:
        """How many forwards this rank runs over `groups` micro-batches, `mine` of them its own."""
        return mine

    def end_step(self, net: nn.Module) -> None:
        """After the step's last pass."""

    def clip_grad_norm(self, params: list[nn.Parameter], max_norm: float) -> float:
        return clip_grad_norm(params, max_norm)

    def sum_over_ranks(self, *tensors: torch.Tensor) -> None:
        """Sum CPU bookkeeping tensors over the ranks, in place."""
        sum_over_ranks(self.world, self.device, *tensors)

    # ---- pushes and checkpoints ---------------------------------------------------------------------

    def push_source(self, model: nn.Module, lora: LoraSection | None, dtype: torch.dtype | None, bucket_bytes: int,
                    announce: Callable[[Path | None], None] | None = None) -> WeightBuckets:
        """The policy's weights for a push (learner/weights/source.py). `announce`: how rank 0 tells the other
        ranks to join a push that is a collective; unused where it is not."""
        return push_source(model, lora, dtype, bucket_bytes)

    def file_optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        """AdamW's state as a single-file checkpoint keeps it (by parameter index)."""
        return optimizer.state_dict()

    def load_optimizer_state(self, net: nn.Module, optimizer: torch.optim.Optimizer, saved: dict) -> None:
        """A single-file checkpoint's AdamW state (by parameter index) into `optimizer`."""
        optimizer.load_state_dict(saved)

    def load_critic_state(self, net: nn.Module, state: dict | None) -> None:
        """A single-file checkpoint's critic (value head or separate critic) into `net`."""
        net.load_critic_state_dict(state or {})


def clip_grad_norm(params: list[nn.Parameter], max_norm: float) -> float:
    """clip_grad_norm_ that also takes sharded (DTensor) gradients: the norm of a shard is partial, so the
    total is reduced over ranks before the clip coefficient is applied; plain tensors take the same path."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)
