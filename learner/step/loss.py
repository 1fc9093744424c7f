"""Losses: decoupled PPO with TIS or IcePop-style masking, aggregation weights, k3 KL, clipped value loss.

The formulas, with worked examples: docs/estimators.md ("The loss", "step_kl").
All tensors are flat over action tokens unless said otherwise.
"""
from __future__ import annotations

import torch


def behaviour_weights(prox_logp: torch.Tensor, behav_logp: torch.Tensor, *, mode: str = "truncate",
                      cap: float = 2.0, low: float = 0.5, high: float = 5.0,
                      seq_index: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """w = pi_prox / mu (stop-grad), truncated (TIS) or zeroed outside [low, high] (token or sequence mask).

    Masked tokens stay in the loss denominator (AReaL): masking must not up-weight the tokens it keeps.
    Sequence masking uses the geometric mean of the sequence's token weights, as AReaL does.
    """
    log_w = (prox_logp - behav_logp).detach()
    w = torch.exp(log_w)
    keep = torch.ones_like(w, dtype=torch.bool)
    if mode == "truncate":
        out = w.clamp(max=cap)
    elif mode == "mask_token":
        keep = (w >= low) & (w <= high)
        out = w * keep
    elif mode == "mask_sequence":
        assert seq_index is not None, "sequence masking needs each token's sequence index"
        n = int(seq_index.max()) + 1 if seq_index.numel() else 0
        sums = torch.zeros(n, dtype=log_w.dtype, device=log_w.device).index_add_(0, seq_index, log_w)
        counts = torch.zeros_like(sums).index_add_(0, seq_index, torch.ones_like(log_w))
        geo = torch.exp(sums / counts.clamp(min=1))
        keep = ((geo >= low) & (geo <= high))[seq_index]
        out = w * keep
    elif mode == "none":
        out = torch.ones_like(w)
    else:
        raise ValueError(f"unknown behaviour weight mode {mode!r}")
    stats = {
        "is_weight_mean": w.mean().item() if w.numel() else 1.0,
        "is_weight_max": w.max().item() if w.numel() else 1.0,
        "is_weight_truncated_fraction": (w > cap).float().mean().item() if mode == "truncate" and w.numel() else 0.0,
        "is_weight_masked_fraction": (~keep).float().mean().item() if w.numel() else 0.0,
    }
    return out, stats


def aggregation_weights(act_episode: torch.Tensor, num_episodes: int, mode: str = "token-mean") -> torch.Tensor:
    """Per-token weights such that loss = sum_t weight_t * l_t reproduces the aggregation mode.

    Computed once over the whole update batch, so splitting it into micro-batches or ranks (which sum
    their parts) does not change the objective: one global denominator.
    """
    counts = torch.bincount(act_episode, minlength=num_episodes).to(torch.float32)
    if mode == "token-mean":
        return torch.full(act_episode.shape, 1.0 / max(1, act_episode.numel()))
    if mode == "seq-mean-token-sum":
        return torch.full(act_episode.shape, 1.0 / max(1, num_episodes))
    if mode == "seq-mean-token-mean":
        return 1.0 / (num_episodes * counts[act_episode])
    raise ValueError(f"unknown loss aggregation {mode!r}")


def group_log_ratio(log_ratio: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Turn-level ratio: the mean log-ratio of each group (turn), broadcast back to its tokens."""
    n = int(group.max()) + 1 if group.numel() else 0
    sums = torch.zeros(n, dtype=log_ratio.dtype, device=log_ratio.device).index_add(0, group, log_ratio)
    counts = torch.zeros_like(sums).index_add_(0, group, torch.ones_like(log_ratio.detach()))
    return (sums / counts.clamp(min=1))[group]


def decoupled_ppo_loss(logp: torch.Tensor, prox_logp: torch.Tensor, behav_logp: torch.Tensor,
                       advantages: torch.Tensor, *, clip_low: float, clip_high: float, weight_cap: float,
                       mode: str = "truncate", mask_low: float = 0.5, mask_high: float = 5.0,
                       seq_index: torch.Tensor | None = None, ratio_group: torch.Tensor | None = None,
                       token_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """-w * min(u A, clip(u) A) with u = pi_theta / pi_prox, aggregated by `token_weights` (default: mean).

    `ratio_group` (a turn id per token) replaces the token ratio by the turn's geometric-mean ratio.
    """
    w, stats = behaviour_weights(prox_logp, behav_logp, mode=mode, cap=weight_cap, low=mask_low,
                                 high=mask_high, seq_index=seq_index)
    log_ratio = logp - prox_logp.detach()
    if ratio_group is not None:
        log_ratio = group_log_ratio(log_ratio, ratio_group)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = w * torch.maximum(unclipped, clipped)
    if token_weights is None:
        token_weights = torch.full_like(per_token, 1.0 / max(1, per_token.numel()))
    loss = (token_weights * per_token).sum()
    with torch.no_grad():
        kl = (ratio - 1) - log_ratio
        outside = (ratio < 1 - clip_low) | (ratio > 1 + clip_high)
        stats.update(
            policy_loss=loss.item(),
            approx_kl=kl.mean().item() if kl.numel() else 0.0,
            clip_fraction=outside.float().mean().item() if kl.numel() else 0.0,
        )
    return loss, stats


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi_theta || pi_ref) per token: e^-l - 1 + l, l = log pi_theta - log pi_ref."""
    log_ratio = (logp - ref_logp.detach()).clamp(-10, 10)  # verl clamps the same way; keeps exp finite
    return torch.exp(-log_ratio) - 1 + log_ratio


def step_kl(before: torch.Tensor, after: torch.Tensor) -> float:
    """KL(pi_before || pi_after) over the batch's action tokens, token-mean (the default loss's measure).

    Schulman's k3 on the sampled tokens: (rho - 1) - log rho, rho = pi_after / pi_before; unbiased where the
    tokens were sampled from pi_before, and close to it for tokens a few versions old. Never negative.
    """
    if before.numel() == 0:
        return 0.0
    log_rho = (after - before).double()
    return float((torch.expm1(log_rho) - log_rho).mean())


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float,
               weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """0.5 max((V - G)^2, (V_clip - G)^2), V_clip = V_old + clip(V - V_old, -c, c); c = 0: plain MSE/2."""
    old_values, returns = old_values.detach(), returns.detach()
    unclipped = (values - returns) ** 2
    if clip > 0:
        clipped_v = old_values + (values - old_values).clamp(-clip, clip)
        per = 0.5 * torch.maximum(unclipped, (clipped_v - returns) ** 2)
        clipfrac = ((values - old_values).abs() > clip).float().mean().item() if values.numel() else 0.0
    else:
        per, clipfrac = 0.5 * unclipped, 0.0
    if weights is None:
        weights = torch.full_like(per, 1.0 / max(1, per.numel()))
    return (weights * per).sum(), {"value_clip_fraction": clipfrac}


def explained_variance(values: torch.Tensor, returns: torch.Tensor, eps: float = 1e-5) -> float:
    """1 - Var(G - V) / Var(G): 1 is a perfect critic, 0 no better than a constant, negative worse."""
    if returns.numel() < 2:
        return 0.0
    var = returns.var(unbiased=False)
    return float(1.0 - (returns - values).var(unbiased=False) / (var + eps))
