"""The one place the parallel strategy is chosen, with the format of its checkpoints: from learner.parallel and
the ranks torchrun started."""
from __future__ import annotations

import logging

import torch.distributed as dist

from turnstream.learner.checkpoint.formats import Sharded, SingleFile
from turnstream.learner.device import Placement
from turnstream.learner.parallel.data_parallel import DataParallel, SingleProcess
from turnstream.learner.parallel.fsdp2 import FullySharded
from turnstream.learner.parallel.strategy import ParallelStrategy

log = logging.getLogger("turnstream.learner")


def strategy_for(parallel: str, where: Placement) -> ParallelStrategy:
    """fsdp2 shards only with more than one rank (one rank has nothing to shard with); ddp with one rank, or any
    learner without a process group, is one process. fsdp2 writes sharded checkpoints on any number of ranks, so
    a run's checkpoints have one format whatever its ranks; the others write a single file."""
    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    if world == 1:
        if parallel == "fsdp2":
            log.info("learner.parallel = fsdp2 with one process: training unsharded (start it with torchrun "
                     "--nproc-per-node N to shard)")
        return SingleProcess(where, rank, world, Sharded() if parallel == "fsdp2" else SingleFile())
    if parallel == "fsdp2":
        return FullySharded(where, rank, world, Sharded())
    return DataParallel(where, rank, world, SingleFile())
