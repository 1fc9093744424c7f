"""LoRA (`[learner.lora]`): low-rank adapters on a frozen base, through transformers' PEFT integration.

`attach` injects peft's LoRA layers into the Hugging Face model in place (`model.add_adapter`), so the model
keeps its class, its forward, its decoder layers (what fsdp2 shards per unit) and its checkpointing hooks;
only the adapters (`lora_A`, `lora_B`) require gradients, so the optimizer holds state for them alone. The
shared value head and a separate critic sit outside the policy model and train as without LoRA.

What a push carries (learner/weights/source.py, from the policy's state dict):
- `push = "adapter"`: the adapters alone, under the names of a PEFT adapter file (`adapter_tensors`), which
  learner/sync/lora.py writes and the servers load as a LoRA adapter. The base never changes and is
  never pushed again.
- `push = "merged"`: W + (alpha / rank) B A under the base's own names (`merged_tensors`), for any full-weight
  backend, for servers that do not serve adapters.

A checkpoint's `model/` directory holds the adapter (transformers' `save_pretrained` writes the PEFT adapter of
a model with one attached); a resume loads the base from `model.path` and the adapter from the checkpoint.
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from turnstream.core.config_lora import LoraSection

log = logging.getLogger("turnstream.learner")

ADAPTER = "default"  # peft's name for the one adapter
ADAPTER_FILE = "adapter_model.safetensors"
_BASE = ".base_layer."
_LORA = (".lora_A." + ADAPTER + ".", ".lora_B." + ADAPTER + ".")


def peft_config(cfg: LoraSection, base_model: str = ""):
    from peft import LoraConfig

    # no dropout: the learner runs in eval mode so that pi_theta equals pi_prox at equal weights
    return LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, target_modules=list(cfg.target_modules), lora_dropout=0.0,
                      bias="none", use_rslora=False, base_model_name_or_path=base_model or None)


def attach(model: torch.nn.Module, cfg: LoraSection | None, adapter_dir: str | Path | None = None) -> torch.nn.Module:
    """Adapters on `model` (in place; the base frozen), their weights from `adapter_dir`, a resumed checkpoint's
    model directory, which must hold an adapter exactly when `cfg` asks for one."""
    from turnstream.core.configtools import ConfigError

    saved = adapter_dir is not None and (Path(adapter_dir) / ADAPTER_FILE).is_file()
    if adapter_dir is not None and saved != (cfg is not None):  # its optimizer state would not fit either
        raise ConfigError(f"learner.lora: the checkpoint {Path(adapter_dir).parent} was written "
                          f"{'with' if saved else 'without'} LoRA; resume it {'with' if saved else 'without'} "
                          "[learner.lora], or start a new run.run_dir")
    if cfg is None:
        return model
    try:
        model.add_adapter(peft_config(cfg))
    except ValueError as exc:  # e.g. a target module the model does not have
        raise ConfigError(f"learner.lora.target_modules: {exc}") from None
    if saved:
        load_adapter(model, Path(adapter_dir) / ADAPTER_FILE)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    log.info("LoRA rank %d on %s: %d of %d parameters train (%.2f%%)", cfg.rank, ", ".join(cfg.target_modules),
             trainable, total, 100.0 * trainable / max(total, 1))
    return model


def load_adapter(model: torch.nn.Module, path: Path) -> None:
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    result = set_peft_model_state_dict(model, load_file(str(path)), adapter_name=ADAPTER)
    missing = [k for k in result.missing_keys if any(s in k for s in _LORA)]
    if missing:
        raise ValueError(f"{path}: the adapter lacks {len(missing)} tensors the model has, e.g. {missing[0]}")


def is_adapter(name: str) -> bool:
    return any(s in name for s in _LORA)


def adapter_name(name: str) -> str:
    """The PEFT adapter file's name of an adapter tensor: model.layers.0.q_proj.lora_A.default.weight ->
    base_model.model.model.layers.0.q_proj.lora_A.weight (what peft saves and vLLM loads)."""
    return "base_model.model." + name.replace("." + ADAPTER + ".", ".")


def adapter_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {adapter_name(k): v for k, v in state.items() if is_adapter(k)}


@torch.no_grad()
def merge(weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float) -> torch.Tensor:
    """W + scaling B A, in fp32 whatever the served dtype, then cast back: the merge rounds once."""
    return (weight.float() + scaling * (b.float() @ a.float())).to(weight.dtype)


@torch.no_grad()  # the state may hold the live parameters (keep_vars)
def merged_tensors(state: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """The base's own names and shapes, each adapted layer's weight with its update merged in."""
    out = {}
    for name, t in state.items():
        if is_adapter(name):
            continue
        if _BASE in name:
            layer, param = name.split(_BASE)
            if param == "weight":
                t = merge(t, state[f"{layer}.lora_A.{ADAPTER}.weight"], state[f"{layer}.lora_B.{ADAPTER}.weight"],
                          scaling)
            name = f"{layer}.{param}"
        out[name] = t
    return out
