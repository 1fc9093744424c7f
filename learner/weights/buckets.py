"""The weights of a push, bucket by bucket (`learner.push_bucket_mb`): no rank holds the whole model at once.

A push reads the policy's tensors in state-dict order, cast to the served dtype, in consecutive groups of at
most `bucket_bytes` (a tensor larger than that is a bucket of its own). Under fsdp2 each tensor is a shard
(DTensor): it is cast on the shard, then all-gathered (`full_tensor()`, a collective), so every rank iterates
the same buckets in the same order and holds one bucket of full tensors at a time; rank 0 hands each bucket
to the nccl backend, which broadcasts it, and drops it before the next is gathered. The disk backend gathers
nothing: each rank writes the rows of its shards straight into the bucket's safetensors file
(`rows_to_write`, learner/weights/files.py). The names, shapes and dtypes of every tensor are known before
any is gathered (the nccl backend announces them to the servers first).

A sharded source can be read once (its gathers are collectives that the other ranks join when rank 0
`announce`s the push); `finish()` runs whatever a failed transfer did not read, so the ranks stay in step.
An unsharded source reads the live tensors and may be read again (a resync).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

Bucket = list[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return int(torch.Size(self.shape).numel()) * torch.empty((), dtype=self.dtype).element_size()


def plan(specs: list[TensorSpec], bucket_bytes: int) -> list[list[TensorSpec]]:
    """Consecutive groups of at most `bucket_bytes` each (a larger tensor alone); 0: everything in one."""
    buckets: list[list[TensorSpec]] = []
    size = 0
    for spec in specs:
        if not buckets or (bucket_bytes and size + spec.nbytes > bucket_bytes and buckets[-1]):
            buckets.append([])
            size = 0
        buckets[-1].append(spec)
        size += spec.nbytes
    return buckets


def _is_sharded(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


class WeightBuckets:
    """Iterable of buckets [(name, full tensor)] over `tensors` (name -> tensor or DTensor shard)."""

    def __init__(self, tensors: dict[str, torch.Tensor], dtype: torch.dtype | None, bucket_bytes: int = 0,
                 announce: Callable[[Path | None], None] | None = None):
        self.tensors, self.dtype, self.announce = tensors, dtype, announce  # announce(directory or None)
        self.specs = [TensorSpec(n, tuple(t.shape), self._dtype(t)) for n, t in tensors.items()]
        self.buckets = plan(self.specs, bucket_bytes)
        self.replayable = not any(_is_sharded(t) for t in tensors.values())
        self._once: Iterator[Bucket] | None = None
        self._read_to_end = False

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.specs)

    def _dtype(self, t: torch.Tensor) -> torch.dtype:
        return self.dtype if self.dtype is not None and t.is_floating_point() else t.dtype

    def _full(self, t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        t = t.to(self._dtype(t))  # on the shard: a bf16 push gathers half the bytes
        return t.full_tensor() if _is_sharded(t) else t

    def _read(self) -> Iterator[Bucket]:
        self._start(None)
        for specs in self.buckets:
            bucket = [(s.name, self._full(self.tensors[s.name])) for s in specs]
            yield bucket
            del bucket  # the caller's references are the only ones left while the next bucket is gathered
        self._read_to_end = True

    def _start(self, directory: Path | None) -> None:
        """Tell the other ranks to join: in the gathers (directory None) or in writing rows into `directory`."""
        if self.announce is not None:
            self.announce(directory)
        self.announce = None

    def rows_to_write(self, directory: Path) -> list[list[tuple[TensorSpec, torch.Tensor]]]:
        """Sharded, for the disk backend: instead of gathers, every rank writes its own rows of each tensor into
        the bucket files in `directory` (learner/weights/files.py, write_files). Announced to the other
        ranks by rank 0; returns each bucket's specs with the tensors (shards) to write."""
        self._start(directory)
        self._read_to_end = True
        return [[(s, self.tensors[s.name]) for s in specs] for specs in self.buckets]

    @property
    def spent(self) -> bool:
        """A sharded source read to its end: reading it again would start gathers no other rank joins."""
        return not self.replayable and self._read_to_end

    def __iter__(self) -> Iterator[Bucket]:
        if self.replayable:
            return self._read()
        if self._once is None:
            self._once = self._read()
        return self._once

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every (name, tensor), bucket after bucket (a bucket is let go before the next is gathered)."""
        buckets = iter(self)
        while (bucket := next(buckets, None)) is not None:
            yield from bucket
            del bucket

    def finish(self) -> None:
        """Read what is left of a sharded source (the other ranks are gathering with us); nothing otherwise."""
        if not self.replayable and not self._read_to_end:
            deque(self, maxlen=0)  # holds none of the buckets
