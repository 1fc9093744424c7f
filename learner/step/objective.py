"""The loss of one micro-batch, every term summed in one place (docs/estimators.md, "The loss").

loss = decoupled PPO  -  entropy_coef * entropy bonus  +  kl_coef * k3 KL to pi_ref  +  value_coef * value loss

Each term is a sum over the micro-batch's tokens with weights that already divide by the whole update's
count (learner/step/loss.py, aggregation_weights), so summing the micro-batches' losses, also over data-parallel
ranks, gives the loss of the whole update.

Episodes served to the critic alone (Batch.critic_only) have a loss of their own, the value term alone
(`value_term`), taken in a pass of their own (learner/step/trainer.py); no weight of the other terms counts them,
so adding them to a batch changes no term the policy learns from.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from turnstream.core.config import LearnerSection
from turnstream.learner.batch.forward import MicroBatch
from turnstream.learner.step.loss import aggregation_weights, decoupled_ppo_loss, kl_k3, value_loss
from turnstream.learner.step.step_inputs import StepInputs


@dataclass
class UpdateWeights:
    """One optimizer step's per-token weights over the batch's action tokens (0 outside its episodes)."""
    policy: torch.Tensor  # the loss aggregation (learner.loss_agg) over the update's episodes
    value: torch.Tensor  # token-mean over the update's critic positions


def update_weights(x: StepInputs, rows: torch.Tensor, loss_agg: str) -> UpdateWeights:
    """The policy's weights over the update's trained tokens, less those of episodes served to the critic alone
    (their episodes do not count for the aggregation either). The critic's: 1/n at each of its positions, n the
    number of the policy's episodes' positions (of all, where the update has none), so a critic-only position
    weighs what any other does and adding critic-only episodes rescales no term the shared backbone learns from."""
    tb = x.tb
    in_update = torch.isin(tb.act_episode, rows)
    if tb.act_trained is not None:
        in_update &= tb.act_trained
    policy_rows = rows[~torch.isin(rows, tb.critic_only_rows())]
    for_policy = in_update & torch.isin(tb.act_episode, policy_rows)
    local = torch.full((tb.num_episodes,), -1, dtype=torch.long)
    local[policy_rows] = torch.arange(len(policy_rows))
    policy = torch.zeros(tb.act_tokens.numel())
    policy[for_policy] = aggregation_weights(local[tb.act_episode[for_policy]], len(policy_rows), loss_agg)
    value = torch.zeros_like(policy)
    if x.advantages.value_mask is not None:
        trained = x.advantages.value_mask & in_update
        counted = int((trained & torch.isin(tb.act_episode, policy_rows)).sum()) or int(trained.sum())
        value[trained] = 1.0 / max(1, counted)
    return UpdateWeights(policy, value)


def weighted_mean(w: torch.Tensor, per_token: torch.Tensor) -> float:
    return float((w * per_token.detach()).sum() / w.sum().clamp(min=1e-12))


def microbatch_loss(cfg: LearnerSection, x: StepInputs, mb: MicroBatch, logp: torch.Tensor, entropy: torch.Tensor,
                    prox: torch.Tensor, values: torch.Tensor | None,
                    weights: UpdateWeights) -> tuple[torch.Tensor, dict[str, float]]:
    """The micro-batch's share of the update's loss, and its statistics. logp, entropy, prox and values are
    the micro-batch's own tokens', on the device; everything else is read from `x` at `mb.select`."""
    sel = mb.select

    def here(t: torch.Tensor) -> torch.Tensor:
        return t[sel].to(logp.device)

    w = here(weights.policy)
    loss, stats = decoupled_ppo_loss(
        logp, prox, here(x.tb.behav_logp), here(x.advantages.token_adv), clip_low=cfg.clip_low,
        clip_high=cfg.clip_high, weight_cap=cfg.behaviour_weight_cap, mode=cfg.behaviour_weight_mode,
        mask_low=cfg.is_mask_low, mask_high=cfg.is_mask_high, seq_index=here(x.tb.act_episode),
        ratio_group=None if x.ratio_group is None else here(x.ratio_group), token_weights=w)
    stats["entropy"] = weighted_mean(w, entropy)
    if x.entropy_scale is not None:
        # in units of the largest entropy the token could have (log of its allowed set's size, or of the
        # vocabulary), so one coefficient means the same for two actions as for a free-text vocabulary, times
        # the episode's weight (learner.entropy_weight)
        loss = loss - cfg.entropy_coef * (w * entropy * here(x.entropy_scale)).sum()
    if x.ref_logp is not None:
        kl = kl_k3(logp, here(x.ref_logp))
        stats["ref_kl"] = weighted_mean(w, kl)
        loss = loss + cfg.kl_coef * (w * kl).sum()
    if values is not None:
        value_part, value_stats = value_term(cfg, x, mb, values, weights)
        stats.update(value_stats)
        loss = loss + value_part
    return loss, stats


def value_term(cfg: LearnerSection, x: StepInputs, mb: MicroBatch, values: torch.Tensor,
               weights: UpdateWeights) -> tuple[torch.Tensor, dict[str, float]]:
    """The value loss's term of the micro-batch, times critic.value_coef: the whole loss of a micro-batch of
    episodes served to the critic alone, and the critic's share of any other's."""
    sel = mb.select
    vl, stats = value_loss(values.float(), x.old_values[sel].to(values.device),
                           x.advantages.value_targets[sel].to(values.device), cfg.critic.value_clip,
                           weights.value[sel].to(values.device))
    stats["value_loss"] = vl.item()
    return cfg.critic.value_coef * vl, stats
