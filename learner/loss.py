"""Decoupled PPO (AReaL): PPO-clip on pi_theta / pi_prox, times the truncated behaviour weight pi_prox / mu."""
from __future__ import annotations

import torch


def decoupled_ppo_loss(logp: torch.Tensor, prox_logp: torch.Tensor, behav_logp: torch.Tensor,
                       advantages: torch.Tensor, *, clip_low: float, clip_high: float,
                       weight_cap: float) -> tuple[torch.Tensor, dict[str, float]]:
    """All inputs are flat over action tokens; the loss is the token mean."""
    behaviour_weight = torch.exp(prox_logp - behav_logp).detach()
    truncated = behaviour_weight.clamp(max=weight_cap)
    prox_logp = prox_logp.detach()
    ratio = torch.exp(logp - prox_logp)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = (truncated * torch.maximum(unclipped, clipped)).mean()
    with torch.no_grad():
        log_ratio = logp - prox_logp
        stats = {
            "policy_loss": loss.item(),
            "approx_kl": ((ratio - 1) - log_ratio).mean().item(),
            "clip_fraction": ((ratio < 1 - clip_low) | (ratio > 1 + clip_high)).float().mean().item(),
            "is_weight_mean": behaviour_weight.mean().item(),
            "is_weight_max": behaviour_weight.max().item(),
            "is_weight_truncated_fraction": (behaviour_weight > weight_cap).float().mean().item(),
        }
    return loss, stats
