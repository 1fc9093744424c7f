"""An estimator's advantages from explicit settings rather than a run's config, for the tests and the checks of
docs/estimators.md' worked examples. The learner builds its estimator once (registry.estimator_for)."""
from __future__ import annotations

import numpy as np
import torch

from turnstream.core.config_learner import CriticSection, GigpoSection, LearnerSection, MarsSection, SpoSection
from turnstream.learner.batch.tensors import TensorBatch
from turnstream.learner.estimators.base import Advantages
from turnstream.learner.estimators.registry import estimator_for
from turnstream.learner.estimators.tracker import SpoTracker
from turnstream.protocol.messages import Batch


def compute(estimator: str, batch: Batch, tb: TensorBatch, *, tracker: SpoTracker | None = None,
            spo_normalize: str = "token", gamma: float, lam: float, old_values: torch.Tensor | None,
            agent_ids: np.ndarray | None = None, episodes: np.ndarray | None = None,
            gigpo: GigpoSection | None = None, mars: MarsSection | None = None,
            cut_values: torch.Tensor | None = None) -> Advantages:
    """The advantages of the estimator named `estimator` (Estimator.advantages). `tracker`: the state an
    estimator that keeps one starts from (spo's); `gamma`, `lam`: the critic's; `gigpo`, `mars`: their sections
    (default: their defaults)."""
    cfg = LearnerSection().model_copy(update={
        "estimator": estimator, "spo": SpoSection().model_copy(update={"normalize": spo_normalize}),
        "critic": CriticSection().model_copy(update={"gamma": gamma, "lam": lam}),
        "gigpo": gigpo or GigpoSection(), "mars": mars or MarsSection()})
    chosen = estimator_for(cfg)
    if tracker is not None:
        chosen.load_state_dict(tracker.state_dict())
    return chosen.advantages(batch, tb, old_values, agent_ids, episodes, cut_values)
