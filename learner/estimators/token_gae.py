"""Token-level GAE (`token_gae`): the classic PPO critic over action tokens, observation tokens skipped
(docs/estimators.md, "Token-level GAE")."""
from __future__ import annotations

import numpy as np

from turnstream.learner.batch.tensors import TensorBatch
from turnstream.learner.estimators.value_based import ValueBased


class TokenGae(ValueBased):
    name = "token_gae"

    def step_groups(self, tb: TensorBatch) -> np.ndarray:
        """Every action token is a step of its own."""
        return np.arange(tb.act_tokens.numel())
