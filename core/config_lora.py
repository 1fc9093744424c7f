"""The [learner.lora] table: train low-rank adapters on a frozen base instead of every weight."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from turnstream.core.config_fields import Section

# The ranks vLLM accepts for --max-lora-rank (vllm/config/lora.py): a server is started with the smallest
# of them that holds learner.lora.rank.
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoraSection(Section):
    rank: int = Field(8, ge=1, le=VLLM_MAX_LORA_RANKS[-1], description="r, the adapters' inner dimension")
    alpha: float = Field(16.0, gt=0, description="scale of the update: W + (alpha / rank) B A")
    target_modules: list[str] = Field(
        default_factory=lambda: list(ALL_LINEAR), min_length=1,
        description="names of the linear layers that get adapters (peft's target_modules; the default: every "
        "projection of a Llama/Qwen-style decoder layer)")
    push: Literal["adapter", "merged"] = Field(
        "adapter", description="adapter: push the adapters alone, which the servers load as a LoRA adapter "
        "(vLLM started with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1, as turnstream's own vLLM "
        "command does when this table is set); merged: push base + (alpha / rank) B A as full weights, for "
        "servers that do not serve adapters")
    served_name: str = Field(
        "policy-lora", min_length=1, description="the name the servers serve the adapter under; actors ask for it")

    def scaling(self) -> float:
        return self.alpha / self.rank

    def server_max_rank(self) -> int:
        """vLLM's --max-lora-rank for this rank."""
        return next(r for r in VLLM_MAX_LORA_RANKS if r >= self.rank)

    def served_adapter(self) -> str | None:
        """What the actors ask the servers for: the adapter's name, or None (the base name) for merged pushes."""
        return self.served_name if self.push == "adapter" else None
