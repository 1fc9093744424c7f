"""Advantage estimators as plain functions over numpy arrays.

Everything here is pure arithmetic with no model in sight, so each formula can be checked against its
worked example in docs/estimators.md. The estimator classes beside it (base.py, registry.py) wire these to
batches, the SPO tracker and the critic.
"""
from __future__ import annotations

from typing import NamedTuple

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


def group_relative(x: np.ndarray, group_keys: list, divide_by_std: bool = True, eps: float = 1e-6) -> np.ndarray:
    """x_i - mean of its group, divided by the group's unbiased std (+ eps) unless `divide_by_std` is False.

    A group of one, or one whose values are all equal, carries no signal and gets 0.
    """
    x = np.asarray(x, np.float64)
    adv = np.zeros_like(x)
    for idx in _groups(group_keys).values():
        if len(idx) < 2:
            continue
        g = x[idx]
        adv[idx] = (g - g.mean()) / (g.std(ddof=1) + eps) if divide_by_std else g - g.mean()
    return adv


def grpo_advantages(returns: np.ndarray, group_keys: list, eps: float = 1e-6) -> np.ndarray:
    """GRPO: (r_i - mean_G r) / std_G r within each group of samples of one prompt (unbiased std)."""
    return group_relative(returns, group_keys, True, eps)


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


def discounted_returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """Each step's return-to-go R_h = sum_{k >= h} gamma^(k - h) r_k over one episode's steps."""
    rewards = np.asarray(rewards, np.float64)
    out = np.zeros_like(rewards)
    running = 0.0
    for h in range(len(rewards) - 1, -1, -1):
        running = rewards[h] + gamma * running
        out[h] = running
    return out


class GigpoTerms(NamedTuple):
    """Per turn, episode after episode."""
    step_returns: np.ndarray  # R_h, the discounted return-to-go from the turn
    episode: np.ndarray  # A_E of the turn's episode
    step: np.ndarray  # A_S of the turn within its anchor-state group
    total: np.ndarray  # A_E + omega A_S


def gigpo_step_advantages(step_returns: np.ndarray, prompt_keys: list, observations: list,
                          divide_by_std: bool = False, eps: float = 1e-6) -> np.ndarray:
    """GiGPO's step term, flat over turns: each turn's return-to-go against the turns that acted from the same
    anchor state, i.e. the turns of the same prompt (any episode of the group, its own included) whose
    observation is identical (any hashable: token bytes, a label). A turn alone with its state gets 0."""
    return group_relative(step_returns, list(zip(prompt_keys, observations)), divide_by_std, eps)


def gigpo_advantages(returns: np.ndarray, prompt_keys: list, turn_rewards: list[np.ndarray],
                     observations: list[list], gamma: float, omega: float, divide_by_std: bool = False,
                     eps: float = 1e-6) -> GigpoTerms:
    """GiGPO (Feng et al. 2025, Eq. 3-8): episode e's return against its prompt's group (GRPO's term), plus
    omega times each turn's step term. `turn_rewards[e]` and `observations[e]`: episode e's turns in order."""
    n_turns = np.array([len(r) for r in turn_rewards], np.int64)
    assert [len(o) for o in observations] == n_turns.tolist(), "one observation per turn"
    episode = np.repeat(group_relative(returns, prompt_keys, divide_by_std, eps), n_turns)
    step_returns = np.concatenate([np.zeros(0)] + [discounted_returns(r, gamma) for r in turn_rewards])
    turn_prompts = [k for k, n in zip(prompt_keys, n_turns) for _ in range(n)]
    flat_obs = [o for episode_obs in observations for o in episode_obs]
    step = gigpo_step_advantages(step_returns, turn_prompts, flat_obs, divide_by_std, eps)
    return GigpoTerms(step_returns, episode, step, episode + omega * step)


def mars_advantages(returns_to_go: np.ndarray, baselines: np.ndarray, divide_by_std: bool = False,
                    eps: float = 1e-6) -> np.ndarray:
    """MARS (Yuan et al. 2025): each turn's reward-to-go against the mean over the batch's turns of the same
    baseline group, divided by that group's std as well with `divide_by_std`. A group is a seat (in self-play the
    seats' returns differ systematically: the side that moves first wins more often), or a game group's seat
    (MARSHAL). One value per turn, in the order given; `baselines`: one integer label per turn."""
    g = np.asarray(returns_to_go, np.float64)
    baselines = np.asarray(baselines)
    out = np.zeros_like(g)
    for a in np.unique(baselines):
        sel = baselines == a
        x = g[sel]
        out[sel] = (x - x.mean()) / (x.std() + eps) if divide_by_std else x - x.mean()
    return out


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

