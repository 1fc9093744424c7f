"""Where the learner computes and in which precision, and the dtype the weights are served in.

Mixed precision is autocast, not a bf16 model: parameters, gradients and AdamW's moments stay fp32 (the
master copy), matmuls run in bf16 inside `torch.autocast`. A pure-bf16 model would halve the weight
memory but lose small updates to rounding (lr x update below bf16's 8-bit mantissa step of a weight), which
at RL learning rates (1e-6..1e-5) is most of them. Log-probs and the loss are computed in fp32 from the
bf16 logits (learner/batch/tensors.py upcasts), as vLLM does when it serves bf16.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from turnstream.core.config_learner import LearnerSection

log = logging.getLogger("turnstream.learner")

_DTYPES = {"float32": torch.float32, "float": torch.float32, "fp32": torch.float32,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "half": torch.float16, "fp16": torch.float16}


def set_torch_threads(lc: LearnerSection) -> int:
    """learner.torch_threads applied to this process; 0 keeps torch's default and writes the count it is back
    into `lc`, so that the configuration the run records names the count its arithmetic depended on."""
    if lc.torch_threads:
        torch.set_num_threads(lc.torch_threads)
    else:
        lc.torch_threads = torch.get_num_threads()
    return lc.torch_threads


@dataclass(frozen=True)
class Placement:
    device: torch.device
    compute_dtype: torch.dtype | None  # autocast dtype; None: plain fp32

    def autocast(self):
        if self.compute_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    @property
    def precision(self) -> str:
        return "fp32" if self.compute_dtype is None else "bf16"


def resolve_device(name: str = "auto") -> torch.device:
    """auto: cuda when torch sees a GPU (the rank's local one under torchrun), else cpu."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            from turnstream.core.configtools import ConfigError

            raise ConfigError(f"learner.device: {name} asked for but torch {torch.__version__} sees no CUDA "
                              "device; use auto or cpu")
        if name == "cuda":
            name = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return torch.device(name)


def resolve_precision(precision: str, device: torch.device) -> torch.dtype | None:
    """auto: bf16 autocast on cuda, fp32 on cpu (CPU bf16 matmuls are slower than fp32 on most x86 parts)."""
    if precision == "auto":
        precision = "bf16" if device.type == "cuda" else "fp32"
    return torch.bfloat16 if precision == "bf16" else None


def placement(device: str = "auto", precision: str = "auto") -> Placement:
    dev = resolve_device(device)
    return Placement(dev, resolve_precision(precision, dev))


def attn_implementation(requested: str, device: torch.device) -> str | None:
    """The attention kernel to load the model with; None keeps transformers' default (sdpa)."""
    if requested != "auto":
        return requested
    if device.type == "cuda":
        from transformers.utils import is_flash_attn_2_available

        # flash-attention takes packed rows as cu_seqlens (no T x T mask); sdpa with the block-diagonal mask
        # transformers builds from position ids is correct too, only slower on long packs
        return "flash_attention_2" if is_flash_attn_2_available() else "sdpa"
    return None


def enable_checkpointing(*models) -> None:
    """Activation checkpointing on every decoder layer (non-reentrant: works under no_grad and autocast)."""
    for m in models:
        if m is not None and getattr(m, "supports_gradient_checkpointing", False):
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def keep_checkpointing_active(*models) -> None:
    """transformers checkpoints a layer only when that layer is in training mode, but the learner runs in
    eval mode (no dropout: pi_theta must equal pi_prox at equal weights). Flag only the checkpointed layers
    themselves as training; their children (attention, MLP, any dropout) stay in eval mode."""
    for m in models:
        if m is None:
            continue
        for module in m.modules():
            if type(module).__name__ != "GradientCheckpointingLayer" and not any(
                    c.__name__ == "GradientCheckpointingLayer" for c in type(module).__mro__):
                continue
            if getattr(module, "gradient_checkpointing", False):
                module.training = True


# ---- the dtype vLLM serves ------------------------------------------------------------------------------

def model_dtype(model_dir: str | Path) -> torch.dtype:
    """The checkpoint's declared dtype (config.json `torch_dtype`, or `dtype` in newer transformers)."""
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return torch.float32
    name = cfg.get("torch_dtype") or cfg.get("dtype") or "float32"
    return _DTYPES.get(str(name), torch.float32)


def served_dtype(vllm_dtype: str, model_dir: str | Path) -> torch.dtype:
    """The dtype the servers hold the weights in: `vllm.dtype` (what the launcher passes as --dtype), or for
    "auto" the checkpoint's own dtype. Pushes are cast to it: the nccl backend broadcasts into the servers'
    tensors, which must match exactly, and the disk backend writes half the bytes for a bf16 server."""
    if vllm_dtype in ("", "auto"):
        return model_dtype(model_dir)
    if vllm_dtype not in _DTYPES:
        from turnstream.core.configtools import ConfigError

        raise ConfigError(f"vllm.dtype: unknown dtype {vllm_dtype!r} (float32, bfloat16, float16 or auto)")
    return _DTYPES[vllm_dtype]
