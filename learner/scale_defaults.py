"""The learner settings left at "auto" (core/config_learner.py, AUTO_SETTINGS), chosen from the size of the policy.

The rates that teach a model of half a million parameters from random weights (the tiny model) would move a
pretrained LLM's weights a thousand times as far a step as the rates its recipes use, and the entropy bonus that
keeps the tiny model from collapsing onto one answer would pay a pretrained model for rambling. The size of the
policy tells the two apart: no pretrained language model in use has under ten million parameters, and this system
does not train a larger one from random weights (docs/learning.md, "Starting from a pretrained model"). Among
pretrained models, the rates of the billion-scale recipes barely move a model of a hundred million parameters
(measured on SmolLM2-135M), so models under a billion get rates of their own. The micro-batch budget follows the
same sizes: none for the tiny model, one that bounds the activations of a pretrained model's forward/backward.

The learner resolves the settings from the model it loaded (learner/step/trainer.py). What reads them before
any model is loaded (sft's context limit, inspect without the learner, the TRL baseline's rates) counts the
checkpoint's parameters from its config alone (checkpoint_parameters), to the same number.
"""
from __future__ import annotations

from operator import attrgetter
from pathlib import Path

from turnstream.core.config import LearnerSection
from turnstream.core.config_learner import (AUTO_SETTINGS, LARGE_SCALE, PRETRAINED, PRETRAINED_LORA,
                                            PRETRAINED_SCALE, SMALL_PRETRAINED, SMALL_PRETRAINED_LORA, TINY,
                                            ScaleDefaults)


def defaults_for(parameters: int, lora: bool) -> ScaleDefaults:
    if parameters < PRETRAINED_SCALE:
        return TINY
    if parameters < LARGE_SCALE:
        return SMALL_PRETRAINED_LORA if lora else SMALL_PRETRAINED
    return PRETRAINED_LORA if lora else PRETRAINED


def parameter_count(model) -> int:
    """Every parameter of the policy, frozen ones (a LoRA base) included: the size is the model's, not the update's."""
    return sum(p.numel() for p in model.parameters())


def checkpoint_parameters(model_dir: str | Path) -> int:
    """The parameters of the Hugging Face checkpoint in `model_dir` as the learner counts the loaded model's:
    the model built from its config on the meta device, so no weight is read or allocated."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if not (Path(model_dir) / "config.json").is_file():  # a count of 0 would read as the tiny model
        raise FileNotFoundError(f"{model_dir}: no config.json to count the parameters of")
    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        return parameter_count(AutoModelForCausalLM.from_config(config))


def value_of(cfg: LearnerSection, setting: str):
    """The value of a dotted [learner] key, e.g. "critic.lr"."""
    return attrgetter(setting)(cfg)


def auto_settings(cfg: LearnerSection) -> list[str]:
    return [setting for setting in AUTO_SETTINGS if value_of(cfg, setting) == "auto"]


def resolve(cfg: LearnerSection, parameters: int, longest_context: int = 0) -> LearnerSection:
    """A copy of `cfg` with each setting left at "auto" given its value for a policy of `parameters`. A micro-batch
    budget is never below `longest_context` (vllm.max_model_len): an episode longer than the budget is dropped, so a
    smaller one would throw away every episode that fills its context."""
    chosen, resolved = defaults_for(parameters, cfg.lora is not None), cfg.model_copy(deep=True)
    for setting in auto_settings(cfg):
        table, _, key = setting.rpartition(".")
        value = chosen.value(setting)
        if setting == "max_tokens_per_microbatch" and value:
            value = max(value, longest_context)
        setattr(value_of(resolved, table) if table else resolved, key, value)
    return resolved


def resolve_for_checkpoint(cfg: LearnerSection, model_dir: str | Path) -> LearnerSection:
    """`resolve` for the policy saved in `model_dir`; `cfg` itself when no setting is "auto" (nothing is read)."""
    return resolve(cfg, checkpoint_parameters(model_dir)) if auto_settings(cfg) else cfg


def resolved_settings(before: LearnerSection, after: LearnerSection) -> str:
    """"lr 0.001, entropy_coef 0.2" for the settings that were "auto" in `before`; empty when none was."""
    return ", ".join(f"{setting} {value_of(after, setting):g}" for setting in auto_settings(before))
