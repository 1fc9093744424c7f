"""What one learner step's updates read, gathered before its first update (learner/step/trainer.py).

Two no-grad passes are skipped where the training forward gives the same numbers: with one optimizer step
per batch, every micro-batch's training forward runs at the pre-update weights, in eval mode (no dropout).
- pi_prox (`prox_from_training_forward`): its log-probs are the training forward's own, detached;
- the critic's values (`values_from_training_forward`, critic.whiten resolved to micro-batches): each
  micro-batch's advantages are computed from its own forward's values as it arrives.
Either way the skipped pass's numbers are filled into the StepInputs micro-batch by micro-batch, so what
follows the updates (step_kl, SPO's drift, the critic's statistics) reads them as if the pass had run.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from turnstream.core.config import LearnerSection
from turnstream.learner.batch.tensors import TensorBatch
from turnstream.learner.estimators.base import Advantages, Estimator
from turnstream.learner.batch.forward import MicroBatch
from turnstream.protocol.messages import Batch


@dataclass
class StepInputs:
    """Per action token of the batch (CPU, flat action order) unless said otherwise."""
    batch: Batch
    tb: TensorBatch
    allowed: torch.Tensor  # [S, V] the batch's allowed-token sets, on the device
    advantages: Advantages  # filled micro-batch by micro-batch when values_from_forward
    prox_logp: torch.Tensor  # log pi_prox; filled by the training forward when prox_from_forward
    prox_from_forward: bool
    old_values: torch.Tensor | None  # the critic before the update (value-based estimators)
    cut_values: torch.Tensor | None  # [E] the same critic at each truncated episode's cut; NaN where none is read
    values_from_forward: bool
    ref_logp: torch.Tensor | None  # log pi_ref, the frozen initial policy (kl_coef > 0)
    ratio_group: torch.Tensor | None  # a turn id: turn-level ratio (critic.turn_ratio)
    entropy_scale: torch.Tensor | None  # the entropy bonus's weight over its unit (entropy_bonus.py; entropy_coef > 0)
    agent_ids: np.ndarray | None  # Dr. MAS agent-wise normalisation (agent_norm)


def values_from_training_forward(cfg: LearnerSection, estimator: Estimator, one_microbatch: bool) -> bool:
    """Whether the critic's values come from the training forward (critic.whiten resolved to micro-batches), in
    a step whose batch is `one_microbatch` or not."""
    return estimator.needs_critic and cfg.values_in_step(one_microbatch)


def prox_from_training_forward(cfg: LearnerSection, estimator: Estimator, one_microbatch: bool) -> bool:
    """One optimizer step per batch: pi_prox is the policy of the training forward itself. A value-based step
    that still needs the no-grad pass for its values reads pi_prox there instead."""
    one_update = cfg.epochs * cfg.minibatches == 1
    return one_update and (not estimator.needs_critic or values_from_training_forward(cfg, estimator, one_microbatch))


def proximal_logp(x: StepInputs, mb: MicroBatch, logp: torch.Tensor, keep: bool) -> torch.Tensor:
    """pi_prox's log-probs of the micro-batch's action tokens, on logp's device. From the training forward:
    logp detached, and kept (`keep`) for step_kl and SPO's drift after the step."""
    if not x.prox_from_forward:
        return x.prox_logp[mb.select].to(logp.device)
    prox = logp.detach()
    if keep:
        x.prox_logp[mb.select] = prox.cpu()
    return prox


def fill_values(estimator: Estimator, x: StepInputs, mb: MicroBatch, values: torch.Tensor,
                cut_values: torch.Tensor) -> None:
    """The micro-batch's pre-update values (at its actions and its cuts) from its training forward, and its
    advantages and critic targets from those values (whitened over its own tokens)."""
    sel = mb.select
    x.old_values[sel] = values.detach().float().cpu()
    x.cut_values[mb.cut_rows] = cut_values.detach().float().cpu()
    part = estimator.advantages(x.batch, x.tb, x.old_values, x.agent_ids, mb.rows.numpy(), x.cut_values)
    x.advantages.token_adv[sel] = part.token_adv[sel]
    x.advantages.value_targets[sel] = part.value_targets[sel]
