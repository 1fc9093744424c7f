"""Single-stream Policy Optimisation (`spo`): a persistent per-prompt Beta tracker (tracker.py) as the baseline,
read before the update and folded after it.

Formulas and worked examples: docs/estimators.md, "SPO".
"""
from __future__ import annotations

import math

import numpy as np
import torch

from turnstream.core.config import LearnerSection
from turnstream.learner.batch.tensors import TensorBatch, episode_marks
from turnstream.learner.estimators.base import Advantages, Estimator, per_token
from turnstream.learner.estimators.tracker import SpoTracker
from turnstream.protocol.messages import Batch


class Spo(Estimator):
    """Each episode's return against its prompt's tracked success rate, normalised over the batch under the
    action-token measure (SPO++) or per episode (spo.normalize = "sequence"), broadcast to its action tokens."""

    name = "spo"
    reads_learner_state = True

    def __init__(self, cfg: LearnerSection):
        super().__init__(cfg)
        self.tracker = SpoTracker(cfg.spo.rho_min, cfg.spo.rho_max, cfg.spo.d_half)

    def advantages(self, batch: Batch, tb: TensorBatch, old_values: torch.Tensor | None,
                   agent_ids: np.ndarray | None, episodes: np.ndarray | None = None,
                   cut_values: torch.Tensor | None = None) -> Advantages:
        returns = np.asarray(batch.returns, np.float64)
        baselines = self.tracker.values(batch.prompt_keys)  # read before the update
        episode_adv = normalize_advantages(returns - baselines, tb.tokens_per_episode, self.cfg.spo.normalize)
        baseline_mean = float(baselines.mean()) if tb.num_episodes else 0.0
        return per_token(episode_adv[tb.act_episode.numpy()], agent_ids, baseline_mean)

    @property
    def folds_updated_policy(self) -> bool:
        return self.cfg.spo.drift == "updated"  # the drift against the updated policy, not pi_prox

    def after_step(self, batch: Batch, tb: TensorBatch, prox_logp: torch.Tensor,
                   new_logp: torch.Tensor) -> dict[str, float]:
        logp = new_logp if self.folds_updated_policy else prox_logp
        replayed = episode_marks(batch.replayed, len(batch.episode_ids))
        return {"spo_rho_mean": fold_batch(self.tracker, batch.prompt_keys, batch.returns, tb, logp, replayed)}

    def success_estimates(self, prompt_keys: list[str]) -> np.ndarray:
        return self.tracker.values(prompt_keys)

    def changed_values(self, prompt_keys: list[str]) -> dict[str, float]:
        return {key: self.tracker.value(key) for key in dict.fromkeys(prompt_keys)}

    def state_dict(self) -> dict:
        return self.tracker.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.tracker.load_state_dict(state)


def fold_batch(tracker: SpoTracker, prompt_keys: list[str], returns: list[float], tb: TensorBatch,
               logp: torch.Tensor, replayed: np.ndarray | None = None) -> float:
    """SPO++: fold each episode's outcome in, in the order of the policy version that produced it (not arrival).
    A success served again (`replayed`, buffer.positive_replay) was folded in when it was first trained: its
    outcome is not new evidence of the prompt's success rate.

    Its drift D = mean |log mu - log pi| over the episode's action tokens, pi's log-probs being `logp`.
    Returns the mean rho."""
    drift = (logp - tb.behav_logp).abs()
    n = tb.num_episodes
    divergence = torch.zeros(n).index_add_(0, tb.act_episode, drift) / torch.from_numpy(
        np.maximum(tb.tokens_per_episode, 1)).float()
    min_version = torch.full((n,), 1 << 30, dtype=torch.long).scatter_reduce(
        0, tb.act_episode, tb.act_versions, reduce="amin")
    order = sorted((i for i in range(n) if replayed is None or not replayed[i]), key=lambda i: (int(min_version[i]), i))
    rhos = [tracker.update(prompt_keys[i], returns[i], float(divergence[i])) for i in order]
    return float(np.mean(rhos)) if rhos else 1.0


def normalize_advantages(raw: np.ndarray, n_tokens: np.ndarray, measure: str, eps: float = 1e-8) -> np.ndarray:
    """Standardise per-episode advantages over the batch.

    measure="token" (SPO++): mean and std weighted by each episode's action-token count, the measure a
    token-mean loss puts on episodes, so the update carries no length-correlated push.
    measure="sequence" (SPO): equal episode weights, unbiased std, as the reference implementation.
    """
    raw = np.asarray(raw, np.float64)
    if raw.size < 2:
        return np.zeros_like(raw)
    if measure == "sequence":
        return (raw - raw.mean()) / (raw.std(ddof=1) + eps)
    w = np.asarray(n_tokens, np.float64)
    if w.sum() <= 0:
        return np.zeros_like(raw)
    mu = float((w * raw).sum() / w.sum())
    sigma = math.sqrt(float((w * (raw - mu) ** 2).sum() / w.sum()))
    return (raw - mu) / (sigma + eps)
