"""Advantage estimators as plain functions over numpy arrays.

Everything here is pure arithmetic with no model in sight, so each formula can be checked against its
worked example in docs/estimators.md. learner/estimators.py wires these to batches, the SPO tracker and the critic.
"""
from __future__ import annotations

import numpy as np


def whiten(x: np.ndarray, weights: np.ndarray | None = None, eps: float = 1e-8) -> np.ndarray:
    """(x - mean) / std under the given measure (default: equal weights, population std)."""
    x = np.asarray(x, np.float64)
    if x.size < 2:
        return np.zeros_like(x)
    w = np.ones_like(x) if weights is None else np.asarray(weights, np.float64)
    if w.sum() <= 0:
        return np.zeros_like(x)
    mu = (w * x).sum() / w.sum()
    sigma = np.sqrt((w * (x - mu) ** 2).sum() / w.sum())
    return (x - mu) / (sigma + eps)


def _groups(keys: list) -> dict:
    out: dict = {}
    for i, k in enumerate(keys):
        out.setdefault(k, []).append(i)
    return out


def grpo_advantages(returns: np.ndarray, group_keys: list, eps: float = 1e-6) -> np.ndarray:
    """GRPO: (r_i - mean_G r) / std_G r within each group of samples of one prompt (unbiased std).

    A group of one sample, or one with equal rewards, carries no signal and gets 0.
    """
    r = np.asarray(returns, np.float64)
    adv = np.zeros_like(r)
    for idx in _groups(group_keys).values():
        if len(idx) < 2:
            continue
        g = r[idx]
        adv[idx] = (g - g.mean()) / (g.std(ddof=1) + eps)
    return adv


def rloo_advantages(returns: np.ndarray, group_keys: list) -> np.ndarray:
    """RLOO: r_i - mean of the other samples of the same prompt (= G/(G-1) (r_i - mean_G r))."""
    r = np.asarray(returns, np.float64)
    adv = np.zeros_like(r)
    for idx in _groups(group_keys).values():
        g = len(idx)
        if g < 2:
            continue
        total = r[idx].sum()
        adv[idx] = r[idx] - (total - r[idx]) / (g - 1)
    return adv


def gae(rewards: np.ndarray, values: np.ndarray, gamma: float, lam: float,
        bootstrap: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """GAE over one episode's steps (turns for turn_gae, action tokens for token_gae).

    `bootstrap` is V after the last step: 0 at termination, the critic's estimate for an unfinished episode.
    Returns (advantages A_h, critic targets G_h = A_h + V_h).
    """
    rewards = np.asarray(rewards, np.float64)
    values = np.asarray(values, np.float64)
    adv = np.zeros_like(values)
    next_value, next_adv = float(bootstrap), 0.0
    for h in range(len(values) - 1, -1, -1):
        delta = rewards[h] + gamma * next_value - values[h]
        next_adv = delta + gamma * lam * next_adv
        adv[h] = next_adv
        next_value = values[h]
    return adv, adv + values


def agentwise_normalize(adv: np.ndarray, agent_ids: np.ndarray, weights: np.ndarray | None = None,
                        eps: float = 1e-8) -> np.ndarray:
    """Dr. MAS: standardise each agent's advantages with that agent's own mean and std.

    A global baseline mixes agents whose reward scales differ, which shows up as gradient-norm spikes for
    the agent with the larger spread; per-agent statistics remove that.
    """
    adv = np.asarray(adv, np.float64)
    agent_ids = np.asarray(agent_ids)
    w = np.ones_like(adv) if weights is None else np.asarray(weights, np.float64)
    out = np.zeros_like(adv)
    for a in np.unique(agent_ids):
        sel = agent_ids == a
        out[sel] = whiten(adv[sel], w[sel], eps)
    return out

