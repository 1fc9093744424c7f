"""One process, and DistributedDataParallel: every rank holds the whole network, its gradients and AdamW state.

DDP sums gradients by all-reducing buckets while backward is still running (communication overlaps compute);
each rank accumulates its micro-batches locally (`no_sync`) until its last one, so there is one reduction per
optimizer step.
"""
from __future__ import annotations

import contextlib

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
