"""The entropy bonus's per-token scale: the episode's weight (learner.entropy_weight) over the largest entropy the
token could have, so that the loss's bonus is entropy_coef * sum_t w_t * H_t * scale_t.

Weights by episode (docs/estimators.md, "The entropy bonus"):
- uniform: 1 for every episode;
- outcome_variance: 4 v (1 - v), v SPO's success estimate of the episode's task read before the update (the
  Bernoulli variance of its outcome, 1 at v = 1/2): the bonus stays where a task is a coin toss and fades where
  the outcome is settled, failing (before the first successes, where it would hold the policy at uniform) or
  succeeding (where it would fight the last steps to a sure answer). A settled outcome is not a learned one where
  the task key tells apart the tasks an observation-blind policy always wins from those it always loses (goal_walk's
  names the direction): there the weights fall to zero in the trap and leave the policy in it, which is why
  uniform is the default.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from turnstream.core.config import LearnerSection
from turnstream.learner.estimators.base import Estimator
from turnstream.learner.batch.tensors import TensorBatch, max_entropy
from turnstream.protocol.messages import Batch


def _uniform(batch: Batch, estimator: Estimator) -> np.ndarray:
    return np.ones(len(batch.prompt_keys))


def _outcome_variance(batch: Batch, estimator: Estimator) -> np.ndarray:
    v = estimator.success_estimates(batch.prompt_keys)
    return 4.0 * v * (1.0 - v)


EPISODE_WEIGHTS: dict[str, Callable[[Batch, Estimator], np.ndarray]] = {
    "uniform": _uniform, "outcome_variance": _outcome_variance}


def entropy_scale(cfg: LearnerSection, batch: Batch, tb: TensorBatch, estimator: Estimator,
                  vocab_size: int) -> torch.Tensor | None:
    """[N] per action token, or None without a bonus (entropy_coef 0)."""
    if not cfg.entropy_coef:
        return None
    per_episode = torch.from_numpy(EPISODE_WEIGHTS[cfg.entropy_weight](batch, estimator).astype(np.float32))
    return per_episode[tb.act_episode] / max_entropy(tb, vocab_size)
