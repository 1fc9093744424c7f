"""Single-stream Policy Optimisation: a persistent per-prompt Beta tracker as the baseline.

Formulas and worked examples: docs/estimators.md, "SPO". Rewards are taken as success evidence in [0, 1]
(clipped), which keeps the Beta reading valid for fractional rewards.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from turnstream.learner.batch.tensors import TensorBatch


class SpoTracker:
    """Per prompt key a Beta(alpha, beta) over its success rate; old evidence decays by rho per new outcome.

    rho_min, rho_max, d_half: the config's `learner.spo` numbers (rho = 2^(-D / d_half), clipped)."""

    def __init__(self, rho_min: float = 0.875, rho_max: float = 0.96, d_half: float = 0.06):
        self.rho_min, self.rho_max, self.d_half = rho_min, rho_max, d_half
        self.state: dict[str, tuple[float, float]] = {}  # prompt key -> (alpha, beta)

    def value(self, key: str) -> float:
        alpha, beta = self.state.get(key, (0.5, 0.5))  # Jeffreys prior for an unseen prompt
        return alpha / (alpha + beta)

    def values(self, keys: list[str]) -> np.ndarray:
        """value() of each key, in order."""
        return np.array([self.value(k) for k in keys], dtype=np.float64)

    def rho(self, divergence: float) -> float:
        raw = 2.0 ** (-divergence / self.d_half)
        return min(max(raw, self.rho_min), self.rho_max)

    def update(self, key: str, reward: float, divergence: float) -> float:
        """Fold one outcome in, forgetting old evidence faster the further the policy moved. Returns rho."""
        r = min(max(reward, 0.0), 1.0)
        alpha, beta = self.state.get(key, (0.5, 0.5))
        rho = self.rho(divergence)
        self.state[key] = (rho * alpha + r, rho * beta + (1.0 - r))
        return rho

    def state_dict(self) -> dict:
        return {"config": {"rho_min": self.rho_min, "rho_max": self.rho_max, "d_half": self.d_half},
                "state": {k: list(v) for k, v in self.state.items()}}

    def load_state_dict(self, d: dict) -> None:
        self.rho_min, self.rho_max, self.d_half = (float(d["config"][k]) for k in ("rho_min", "rho_max", "d_half"))
        self.state = {k: (float(a), float(b)) for k, (a, b) in d["state"].items()}


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
