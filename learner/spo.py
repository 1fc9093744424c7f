"""Single-stream Policy Optimisation: a persistent per-prompt Beta tracker as the baseline.

Formulas and the worked example: research/learner_math.md section 1. Rewards are taken as success
evidence in [0, 1] (clipped), which keeps the Beta reading valid for fractional rewards.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass
class SpoConfig:
    rho_min: float = 0.875
    rho_max: float = 0.96
    d_half: float = 0.06


class SpoTracker:
    def __init__(self, cfg: SpoConfig | None = None):
        self.cfg = cfg or SpoConfig()
        self.state: dict[str, tuple[float, float]] = {}  # prompt key -> (alpha, beta)

    def init_from_counts(self, key: str, successes: int, n: int) -> None:
        """Offline initialisation: v0 = (s + 0.5)/(n + 1) with N_init = 1/(1 - rho_min) pseudo-counts."""
        n_init = 1.0 / (1.0 - self.cfg.rho_min)
        if n == 0:
            self.state[key] = (0.5, 0.5)
        else:
            self.state[key] = (n_init * (successes + 0.5) / (n + 1), n_init * (n - successes + 0.5) / (n + 1))

    def value(self, key: str) -> float:
        alpha, beta = self.state.get(key, (0.5, 0.5))  # Jeffreys prior for an unseen prompt
        return alpha / (alpha + beta)

    def rho(self, divergence: float) -> float:
        raw = 2.0 ** (-divergence / self.cfg.d_half)
        return min(max(raw, self.cfg.rho_min), self.cfg.rho_max)

    def update(self, key: str, reward: float, divergence: float) -> float:
        """Fold one outcome in, forgetting old evidence faster the further the policy moved. Returns rho."""
        r = min(max(reward, 0.0), 1.0)
        alpha, beta = self.state.get(key, (0.5, 0.5))
        rho = self.rho(divergence)
        self.state[key] = (rho * alpha + r, rho * beta + (1.0 - r))
        return rho

    def sampling_probabilities(self, keys: list[str], eps: float = 0.05) -> np.ndarray:
        """SPO's curriculum (1.4): P(x) proportional to sqrt(v(1 - v)) + eps over a candidate pool of prompts.

        A hook for whoever picks prompts (actors, through the buffer); the learner itself only owns the tracker.
        """
        v = np.array([self.value(k) for k in keys], np.float64)
        w = np.sqrt(v * (1.0 - v)) + eps
        return w / w.sum()

    def state_dict(self) -> dict:
        return {"config": dict(vars(self.cfg)), "state": {k: list(v) for k, v in self.state.items()}}

    def load_state_dict(self, d: dict) -> None:
        self.cfg = SpoConfig(**d["config"])
        self.state = {k: (float(a), float(b)) for k, (a, b) in d["state"].items()}


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

