"""The policy's weights as Hugging Face safetensors files, which vLLM and transformers load: one file per bucket
(learner/weights/buckets.py) with its index. A push's directory (learner/sync/disk.py) and an exported
checkpoint (learner/checkpoint/export.py) are written here. Under fsdp2 nothing is gathered: rank 0 lays out
each file and every rank writes the rows of its own shards into it (write_rows), so no rank holds a full
tensor, and the bytes go to the file once, from the rank that has them instead of through a gather onto rank 0.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import torch

from turnstream.learner.weights.buckets import Bucket, TensorSpec, WeightBuckets


def write_shards(directory: Path, buckets: Iterable[Bucket], count: int) -> None:
    """Hugging Face's safetensors layout, one file per bucket: model.safetensors for one, else
    model-0000i-of-0000n.safetensors and model.safetensors.index.json (which transformers and vLLM read)."""
    from safetensors.torch import save_file

    weight_map, total, names = {}, 0, iter(shard_names(count))
    for bucket in buckets:  # not zip()/enumerate(): their cached result tuple holds the last bucket during a gather
        name = next(names)
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in bucket}
        save_file(tensors, str(directory / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        del tensors, bucket
    write_index(directory, weight_map, total)


def shard_names(count: int) -> list[str]:
    """Hugging Face's names for `count` safetensors files of one model."""
    return ["model.safetensors"] if count == 1 else [f"model-{i:05d}-of-{count:05d}.safetensors"
                                                     for i in range(1, count + 1)]


def write_index(directory: Path, weight_map: dict[str, str], total_bytes: int) -> None:
    """model.safetensors.index.json, which a model in more than one file needs (none for one file)."""
    if len(set(weight_map.values())) > 1:
        index = {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64",
              torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
              torch.bool: "BOOL"}


def write_files(directory: Path, source: WeightBuckets) -> None:
    """The safetensors files of `source` in `directory`, one per bucket. Sharded, every rank writes its own rows
    (write_rows: rank 0 announces the directory to the others) and nothing is gathered; else each bucket is
    written as it is read (write_shards)."""
    if source.replayable:
        write_shards(directory, source, len(source.buckets))
    else:
        write_rows(directory, source.rows_to_write(directory))


def write_rows(directory: Path, buckets: list[list[tuple[TensorSpec, torch.Tensor]]]) -> None:
    """The bucket files of write_shards, written by every rank at once (a collective under fsdp2): rank 0 lays
    out each file (safetensors header, full size), then each rank writes the rows of its dim-0 shards at their
    offsets, cast tensor by tensor; an unsharded tensor is written by rank 0. No rank holds a full tensor, and
    the bytes go to the file straight from their owner instead of through a gather onto rank 0."""
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    count = len(buckets)
    names = shard_names(count)
    starts, failure = None, None
    if rank == 0:
        try:
            starts = [lay_out_file(directory / name, [s for s, _ in bucket]) for name, bucket in zip(names, buckets)]
            write_index(directory, {s.name: name for name, bucket in zip(names, buckets) for s, _ in bucket},
                        sum(s.nbytes for b in buckets for s, _ in b))
        except OSError as exc:  # the other ranks learn it below instead of waiting for offsets
            failure, starts = exc, None
    starts = _from_rank_0(starts)
    if starts is None:
        raise failure or OSError(f"weight push: rank 0 could not lay out the files in {directory}")
    try:
        for name, start, bucket in zip(names, starts, buckets):
            with (directory / name).open("r+b") as f:
                offset = start
                for spec, t in bucket:
                    _write_own_rows(f.fileno(), offset, spec, t, rank)
                    offset += spec.nbytes
    except Exception as exc:  # still meet the other ranks below, then fail
        failure = exc
    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # every rank's rows are in the files
    if failure is not None:
        raise failure


def _from_rank_0(obj):
    """Rank 0's `obj` on every rank of the process group (itself without one)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def lay_out_file(path: Path, specs: list[TensorSpec]) -> int:
    """A safetensors file of the right size with its header (data still zero); returns where the data starts."""
    import struct

    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for s in specs:
        header[s.name] = {"dtype": ST_DTYPES[s.dtype], "shape": list(s.shape),
                          "data_offsets": [offset, offset + s.nbytes]}
        offset += s.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)
    return 8 + len(raw)


def _write_own_rows(fd: int, offset: int, spec: TensorSpec, t: torch.Tensor, rank: int) -> None:
    """This rank's part of tensor `t` (cast to spec.dtype) at `offset`, the tensor's first byte in the file."""
    from torch.distributed.tensor import DTensor, Shard

    t = t.detach()
    if isinstance(t, DTensor) and tuple(t.placements) == (Shard(0),):
        mesh = t.device_mesh
        per_rank = -(-t.shape[0] // mesh.size())  # torch.chunk's split, as FSDP2 and DTensor shard dim 0
        first_row = min(mesh.get_local_rank() * per_rank, t.shape[0])
        local = t.to_local()
        offset += first_row * (spec.nbytes // max(t.shape[0], 1))
    elif isinstance(t, DTensor):  # another placement: gathered (a collective: every rank takes part)
        local = t.full_tensor()
        if rank != 0:
            return
    elif rank == 0:
        local = t
    else:
        return
    data = local.to(spec.dtype).contiguous().reshape(-1).view(torch.uint8).cpu().numpy()
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
