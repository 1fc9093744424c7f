"""The one interface over the advantage estimators: what the learner's step reads of the estimator it runs
(learner/step/), and the advantages it hands back. One class per estimator (spo.py, grpo.py, rloo.py, gigpo.py,
mars.py, turn_gae.py, token_gae.py, turn_td.py), chosen once from `learner.estimator` by registry.py."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from turnstream.core.config import LearnerSection
from turnstream.learner.batch.tensors import TensorBatch
from turnstream.learner.estimators.advantages import agentwise_normalize
from turnstream.learner.estimators.tracker import SpoTracker
from turnstream.protocol.messages import Batch


@dataclass
class Advantages:
    token_adv: torch.Tensor  # [N] per action token
    value_mask: torch.Tensor | None = None  # [N] bool: action tokens whose position trains the critic
    value_targets: torch.Tensor | None = None  # [N] critic targets G (meaningful where value_mask)
    baseline_mean: float = 0.0


class Estimator(ABC):
    """Batch in, per-action-token advantages (and critic targets) out, with a run's learner settings; what it
    needs from the Trainer (a critic, the updated policy's log-probs) and what it keeps across steps."""

    name: ClassVar[str]  # its `learner.estimator`
    needs_critic: ClassVar[bool] = False  # reads a value function: the Trainer builds and trains a critic
    # its advantages depend on what the learner holds (a tracker, a critic), not on the batch alone
    reads_learner_state: ClassVar[bool] = False

    def __init__(self, cfg: LearnerSection):
        self.cfg = cfg

    @abstractmethod
    def advantages(self, batch: Batch, tb: TensorBatch, old_values: torch.Tensor | None,
                   agent_ids: np.ndarray | None, episodes: np.ndarray | None = None,
                   cut_values: torch.Tensor | None = None) -> Advantages:
        """`old_values`: the critic's values at every action token's position (needs_critic only); `agent_ids`:
        per action token, for Dr. MAS agent-wise normalisation; `episodes`, `cut_values`: ValueBased's."""

    def value_positions(self, tb: TensorBatch) -> torch.Tensor:
        """[N] bool: the action tokens whose position the critic is trained on (needs_critic only)."""
        raise NotImplementedError(f"the {self.name} estimator trains no critic")

    @property
    def folds_updated_policy(self) -> bool:
        """Whether after_step reads the updated policy's log-probs of every episode (else of a sample)."""
        return False

    def after_step(self, batch: Batch, tb: TensorBatch, prox_logp: torch.Tensor,
                   new_logp: torch.Tensor) -> dict[str, float]:
        """Fold the trained batch into what the estimator keeps; returns its step statistics. The learner's log
        has the same columns whatever the estimator: one that keeps nothing forgets nothing (rho 1)."""
        return {"spo_rho_mean": 1.0}

    def success_estimates(self, prompt_keys: list[str]) -> np.ndarray:
        """Per prompt key, the estimated task success read before the update (entropy_weight outcome_variance)."""
        raise NotImplementedError(f"the {self.name} estimator keeps no per-task success estimate")

    def changed_values(self, prompt_keys: list[str]) -> dict[str, float]:
        """What the last step changed of the per-prompt values the actors' curriculum reads (tasks.order)."""
        return {}

    def state_dict(self) -> dict:
        """What a checkpoint keeps of it (tracker.json). One that keeps nothing writes an SPO tracker that never
        saw a prompt: tracker.json has one shape whatever the estimator, so that a checkpoint resumes under any
        estimator and `turnstream replay` compares checkpoints leaf by leaf."""
        return SpoTracker(self.cfg.spo.rho_min, self.cfg.spo.rho_max, self.cfg.spo.d_half).state_dict()

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint's state_dict(); one that keeps nothing reads nothing of it."""


def per_token(token: np.ndarray, agent_ids: np.ndarray | None, baseline_mean: float) -> Advantages:
    """Critic-free advantages of the action tokens, Dr. MAS-normalised per agent when asked."""
    if agent_ids is not None:
        token = agentwise_normalize(token, agent_ids)
    return Advantages(torch.from_numpy(token.astype(np.float32)), baseline_mean=baseline_mean)
