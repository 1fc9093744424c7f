"""RLOO (`rloo`): each episode's return against the mean of the other episodes of its prompt in the batch
(docs/estimators.md, "RLOO")."""
from __future__ import annotations

import numpy as np

from turnstream.learner.estimators.advantages import rloo_advantages
from turnstream.learner.estimators.grpo import Grpo


class Rloo(Grpo):
    """GRPO's group with a leave-one-out baseline and no division by the spread."""

    name = "rloo"

    def episode_advantages(self, returns: np.ndarray, prompt_keys: list[str]) -> np.ndarray:
        return rloo_advantages(returns, prompt_keys)
