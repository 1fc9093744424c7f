"""One process, and DistributedDataParallel: every rank holds the whole network, its gradients and AdamW state.

DDP sums gradients by all-reducing buckets while backward is still running (communication overlaps compute);
each rank accumulates its micro-batches locally (`no_sync`) until its last one, so there is one reduction per
optimizer step.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from turnstream.learner.parallel.strategy import ParallelStrategy


class SingleProcess(ParallelStrategy):
    def prepare(self, net: nn.Module, ref_model: nn.Module | None, reshard_after_forward: bool) -> nn.Module:
        if ref_model is not None:
            ref_model.to(self.device)
        return net


class DataParallel(SingleProcess):
    """DDP over the torchrun ranks."""

    def prepare(self, net: nn.Module, ref_model: nn.Module | None, reshard_after_forward: bool) -> nn.Module:
        super().prepare(net, ref_model, reshard_after_forward)
        # No buffer sync per forward: the buffers (rotary tables) are constants, equal everywhere.
        return DistributedDataParallel(net, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                                       forward_sync_buffers=False)

    def gradient_sync(self, train_net: nn.Module, last: bool) -> contextlib.AbstractContextManager:
        # gradients of all but the rank's last micro-batch accumulate locally (forward and backward inside
        # no_sync); the last one's backward reduces them over ranks
        return contextlib.nullcontext() if last else train_net.no_sync()

    @contextlib.contextmanager
    def critic_gradient_sync(self, train_net: nn.Module, params: list[nn.Parameter], last: bool):
        # DDP's reduction waits for a gradient of every parameter, and this pass gives the critic's alone: it runs
        # unreduced, and the critic's gradients are averaged over ranks after the rank's last micro-batch, as DDP
        # averages (the loss is scaled by the world size for that)
        with train_net.no_sync():
            yield
        if last:
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                p.grad.div_(self.world)
                dist.all_reduce(p.grad)
