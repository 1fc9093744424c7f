"""SPO's tracker: a persistent per-prompt Beta estimate of its success rate, the baseline of the spo estimator
(spo.py) and what its checkpoints keep (docs/estimators.md, "SPO"). Rewards are taken as success evidence in [0, 1]
(clipped), which keeps the Beta reading valid for fractional rewards."""
from __future__ import annotations

import numpy as np


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
