"""GiGPO (`gigpo`): grpo's episode term plus a step term per turn, against the turns of the prompt's episodes that
acted from the same observation (GiGPO's anchor states)."""
from __future__ import annotations

import numpy as np
import torch

from turnstream.learner.batch.tensors import TensorBatch
from turnstream.learner.estimators.advantages import gigpo_advantages
from turnstream.learner.estimators.base import Advantages, Estimator, per_token
from turnstream.learner.estimators.episodes import rewards_of_turns, turn_observations
from turnstream.protocol.messages import Batch


class Gigpo(Estimator):
    """GiGPO: each turn's action tokens get its episode's group term plus omega times the turn's step term
    (docs/estimators.md, "GiGPO")."""

    name = "gigpo"

    def advantages(self, batch: Batch, tb: TensorBatch, old_values: torch.Tensor | None,
                   agent_ids: np.ndarray | None, episodes: np.ndarray | None = None,
                   cut_values: torch.Tensor | None = None) -> Advantages:
        settings = self.cfg.gigpo
        observed = turn_observations(batch)
        offsets, turn_index = np.asarray(batch.episode_offsets), np.asarray(batch.turn_index)
        rewards, observations = [], []
        for e in range(tb.num_episodes):
            turns = turn_index[offsets[e]:offsets[e + 1]]
            r = rewards_of_turns(batch, e, int(turns.max()) + 1 if turns.size else 0)
            rewards.append(r)
            # a turn the environment added nothing before stands alone (its state is not told apart)
            observations.append([observed.get((e, h), ("no observation", e, h)) for h in range(len(r))])
        terms = gigpo_advantages(batch.returns, batch.prompt_keys, rewards, observations, settings.gamma,
                                 settings.omega, settings.normalize == "std")
        first_turn = np.cumsum([0] + [len(r) for r in rewards])[:-1]
        token = terms.total[first_turn[tb.act_episode.numpy()] + tb.act_turn.numpy()]
        return per_token(token, agent_ids, float(np.mean(batch.returns)) if tb.num_episodes else 0.0)
