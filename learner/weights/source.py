"""What a push carries of the policy: its state-dict tensors, with learner.lora the adapters alone or the merged
weights (learner/lora.py), read bucket by bucket (learner/weights/buckets.py)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from turnstream.core.config_lora import LoraSection
from turnstream.learner.lora import adapter_tensors, merged_tensors
from turnstream.learner.weights.buckets import WeightBuckets


def policy_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state-dict tensors (shards under fsdp2), a tied weight once, under its first name (the input
    embeddings: what `save_pretrained` keeps and what vLLM reads for a tied LM head)."""
    out, seen = {}, set()
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) not in seen:
            seen.add(id(t))
            out[name] = t
    return out


def push_tensors(state: dict[str, torch.Tensor], cfg: LoraSection | None) -> dict[str, torch.Tensor]:
    """What a push carries of the policy's `state`: all of it without LoRA, else the adapters (push = adapter)
    or the merged weights (push = merged)."""
    if cfg is None:
        return state
    return adapter_tensors(state) if cfg.push == "adapter" else merged_tensors(state, cfg.scaling())


def push_source(model: torch.nn.Module, lora: LoraSection | None, dtype: torch.dtype | None, bucket_bytes: int,
                announce: Callable[[Path | None], None] | None = None) -> WeightBuckets:
    """The policy's weights for a push, cast to `dtype`, read bucket by bucket. `announce` (sharded rank 0
    only): reading them is a collective, and the other ranks are told to join first."""
    tensors = policy_tensors(model)
    if announce is None or lora is None or lora.push == "adapter":
        return WeightBuckets(push_tensors(tensors, lora), dtype, bucket_bytes, announce)
    # A merged LoRA push on sharded rank 0: merging shards takes collectives, so the other ranks are told to
    # join first, as in a gathered push (they merge the same way, then gather along); the merged weights are
    # gathered here whole, and the backend reads them as it reads unsharded weights.
    announce(None)
    merged = WeightBuckets(push_tensors(tensors, lora), dtype, bucket_bytes)
    return WeightBuckets(dict(merged.items()), dtype, bucket_bytes)


def serving_state_dict(model: torch.nn.Module, dtype: torch.dtype, lora: LoraSection | None = None
                       ) -> dict[str, torch.Tensor]:
    """The model's weights for a push as one state dict: floating tensors cast to the served dtype (integer
    buffers as they are), with `lora` the adapters alone or the merged weights."""
    out = {}
    for name, t in push_tensors(model.state_dict(), lora).items():
        t = t.detach()
        out[name] = t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t
    return out
