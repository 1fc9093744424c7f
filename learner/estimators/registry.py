"""The estimators by name: the one place `learner.estimator` is read, once, when the Trainer is built. Adding an
estimator is its module and its line here (docs/estimators.md, "Add an estimator")."""
from __future__ import annotations

from turnstream.core.config import LearnerSection
from turnstream.learner.estimators.base import Estimator
from turnstream.learner.estimators.gigpo import Gigpo
from turnstream.learner.estimators.grpo import Grpo
from turnstream.learner.estimators.mars import Mars
from turnstream.learner.estimators.rloo import Rloo
from turnstream.learner.estimators.spo import Spo
from turnstream.learner.estimators.token_gae import TokenGae
from turnstream.learner.estimators.turn_gae import TurnGae
from turnstream.learner.estimators.turn_td import TurnTd

ESTIMATORS: dict[str, type[Estimator]] = {cls.name: cls for cls in (
    Spo, TurnGae, TokenGae, Grpo, Rloo, Gigpo, Mars, TurnTd)}


def estimator_for(cfg: LearnerSection) -> Estimator:
    """The estimator `learner.estimator` names, with the run's learner settings."""
    try:
        cls = ESTIMATORS[cfg.estimator]
    except KeyError:
        raise ValueError(f"unknown estimator {cfg.estimator!r}; known: {', '.join(ESTIMATORS)}") from None
    return cls(cfg)
