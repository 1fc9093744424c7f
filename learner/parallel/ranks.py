"""Data-parallel plumbing for `torchrun --nproc-per-node N -m turnstream.cli learner ...` (gloo/nccl).

Rank 0 owns every socket (buffer, version PUB, vLLM pushes, metrics, checkpoints); it broadcasts each
batch to the other ranks, and every rank runs the same Trainer.step on it (learner/step/trainer.py deals out
micro-batches and sums gradients). Without torchrun's environment this is one rank and costs nothing.
"""
from __future__ import annotations

import os

import torch.distributed as dist


def init_from_env(device: str = "auto") -> tuple[int, int]:
    """nccl when the learner runs on GPUs (each rank on its LOCAL_RANK device), gloo on CPU."""
    import torch

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        on_gpu = device != "cpu" and torch.cuda.is_available()
        if on_gpu:  # before the group exists: nccl binds each rank to the current device
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if on_gpu else "gloo")
    return (dist.get_rank(), world) if world > 1 else (0, 1)


def broadcast(obj, rank: int, world: int):
    """Rank 0's object on every rank (None is the stop signal)."""
    if world == 1:
        return obj
    box = [obj if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def shutdown(world: int) -> None:
    if world > 1 and dist.is_initialized():
        dist.destroy_process_group()


def sum_over_ranks(world: int, device, *tensors) -> None:
    """Sum CPU bookkeeping tensors over the ranks, in place (through `device`: nccl reduces device tensors only)."""
    if world > 1:
        for t in tensors:
            on_device = t.to(device)
            dist.all_reduce(on_device, op=dist.ReduceOp.SUM)
            t.copy_(on_device.cpu())
