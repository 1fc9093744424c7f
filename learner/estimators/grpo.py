"""GRPO (`grpo`): each episode's return against the mean of its prompt's episodes in the batch, over their standard
deviation (docs/estimators.md, "GRPO")."""
from __future__ import annotations

import numpy as np
import torch

from turnstream.learner.batch.tensors import TensorBatch
from turnstream.learner.estimators.advantages import grpo_advantages
from turnstream.learner.estimators.base import Advantages, Estimator, per_token
from turnstream.protocol.messages import Batch


class Grpo(Estimator):
    """One advantage per episode against its prompt's group in the batch, broadcast to its action tokens."""

    name = "grpo"

    def episode_advantages(self, returns: np.ndarray, prompt_keys: list[str]) -> np.ndarray:
        return grpo_advantages(returns, prompt_keys)

    def advantages(self, batch: Batch, tb: TensorBatch, old_values: torch.Tensor | None,
                   agent_ids: np.ndarray | None, episodes: np.ndarray | None = None,
                   cut_values: torch.Tensor | None = None) -> Advantages:
        returns = np.asarray(batch.returns, np.float64)
        episode_adv = self.episode_advantages(returns, batch.prompt_keys)
        return per_token(episode_adv[tb.act_episode.numpy()], agent_ids,
                         float(returns.mean()) if tb.num_episodes else 0.0)
