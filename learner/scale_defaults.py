"""The learner settings left at "auto", chosen from the size of the policy being trained.

The rates that teach a model of half a million parameters from random weights (the tiny model) would wreck a
pretrained LLM in a few steps, and the entropy bonus that keeps the tiny model from collapsing onto one answer
rewards a pretrained model for rambling. The size of the policy tells the two cases apart: nobody trains a
pretrained LLM of under ten million parameters, and nobody here trains one of more from random weights. Below
the line are the rates measured on the tiny model (BENCHMARKS.md, "The learner learns" and "From a model that
can read"); above it are those the peer systems' recipes use for full fine-tuning and for LoRA, a critic's
included (docs/learning.md, "Starting from a pretrained model").
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

from turnstream.core.config import LearnerSection

PRETRAINED_SCALE = 10_000_000  # parameters from which a policy is taken to be a pretrained language model


@dataclass(frozen=True)
class ScaleDefaults:
    lr: float
    warmup_steps: int
    entropy_coef: float
    critic_lr: float


TINY = ScaleDefaults(lr=1e-3, warmup_steps=0, entropy_coef=0.2, critic_lr=1e-3)
PRETRAINED = ScaleDefaults(lr=1e-6, warmup_steps=10, entropy_coef=0.0, critic_lr=1e-5)
PRETRAINED_LORA = ScaleDefaults(lr=1e-5, warmup_steps=10, entropy_coef=0.0, critic_lr=1e-5)


def defaults_for(parameters: int, lora: bool) -> ScaleDefaults:
    if parameters < PRETRAINED_SCALE:
        return TINY
    return PRETRAINED_LORA if lora else PRETRAINED


def parameter_count(model) -> int:
    """Every parameter of the policy, frozen ones (a LoRA base) included: the size is the model's, not the update's."""
    return sum(p.numel() for p in model.parameters())


def checkpoint_parameters(model_dir: str | Path) -> int:
    """The parameters of a Hugging Face checkpoint, read from its safetensors headers without loading a weight."""
    from safetensors import safe_open

    total = 0
    for path in Path(model_dir).glob("*.safetensors"):
        with safe_open(path, "pt") as tensors:
            total += sum(math.prod(tensors.get_slice(name).get_shape()) for name in tensors.keys())
    return total


def resolve(cfg: LearnerSection, parameters: int) -> LearnerSection:
    """`cfg` with each "auto" among lr, warmup_steps, entropy_coef and critic.lr replaced by its value for a policy
    of `parameters`; the settings given as numbers stay as given."""
    chosen = asdict(defaults_for(parameters, cfg.lora is not None))
    critic_lr = chosen.pop("critic_lr")
    update = {name: value for name, value in chosen.items() if getattr(cfg, name) == "auto"}
    if cfg.critic.lr == "auto":
        update["critic"] = cfg.critic.model_copy(update={"lr": critic_lr})
    return cfg.model_copy(update=update)


def resolved_settings(before: LearnerSection, after: LearnerSection) -> str:
    """"lr 0.001, entropy_coef 0.2" for the settings that were "auto" in `before`; empty when none was."""
    pairs = [(name, getattr(after, name)) for name in ("lr", "warmup_steps", "entropy_coef")
             if getattr(before, name) == "auto"]
    if before.critic.lr == "auto":
        pairs.append(("critic.lr", after.critic.lr))
    return ", ".join(f"{name} {value:g}" for name, value in pairs)
