"""One interface over the advantage estimators: batch in, per-action-token advantages (and critic targets) out.
The formulas, with worked examples: docs/estimators.md.

`learner.estimator` selects one of:
- spo: persistent per-prompt Beta tracker baseline, read before the update (learner/estimators/spo.py);
- grpo / rloo: group baselines over the samples of one prompt_key in the batch;
- gigpo: grpo's episode term plus a step term per turn, against the turns of the prompt's episodes that
  acted from the same observation (GiGPO's anchor states);
- turn_gae: critic read at turn boundaries, GAE across turns, the turn's advantage on its action tokens;
- token_gae: classic token-level PPO critic over action tokens (observation tokens skipped);
- mars: each turn's reward-to-go against the mean of its agent's turns in the batch (MARS's turn-level,
  agent-specific advantage for self-play), whitened;
- turn_td: turn_gae with one-step temporal-difference targets and advantages (lambda = 0); like the other
  critic estimators it takes episodes served to the critic alone (Batch.critic_only, buffer.critic_replay),
  which get critic targets and no advantage.
Terminal-outcome estimators broadcast one scalar per episode; all are normalised under the action-token
measure that the default token-mean loss uses (SPO++), unless spo.normalize says "sequence".
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from turnstream.core.config import LearnerSection
from turnstream.core.config_learner import CRITIC_ESTIMATORS, GigpoSection, MarsSection
from turnstream.learner.batch.tensors import TensorBatch
from turnstream.learner.estimators.advantages import (agentwise_normalize, discounted_returns, gae, gigpo_advantages,
                                                      grpo_advantages, mars_advantages, rloo_advantages, whiten)
from turnstream.learner.estimators.spo import SpoTracker, normalize_advantages
from turnstream.protocol.messages import Batch

ESTIMATORS = ("spo", "turn_gae", "token_gae", "grpo", "rloo", "gigpo", "mars", "turn_td")
VALUE_BASED = CRITIC_ESTIMATORS


@dataclass
class Advantages:
    token_adv: torch.Tensor  # [N] per action token
    value_mask: torch.Tensor | None = None  # [N] bool: action tokens whose position trains the critic
    value_targets: torch.Tensor | None = None  # [N] critic targets G (meaningful where value_mask)
    baseline_mean: float = 0.0


def episode_agent_ids(batch: Batch) -> np.ndarray | None:
    """Agent id of each episode, or None when the batch holds a single agent (nothing to normalise apart).

    Each agent of a multi-agent episode travels as its own episode (actors/play/), so one id per episode."""
    ids = np.asarray(batch.agent_ids)
    if ids.size != len(batch.episode_ids) or np.unique(ids).size < 2:
        return None
    return ids.astype(np.int64)


def token_agent_ids(batch: Batch, tb: TensorBatch) -> np.ndarray | None:
    """Per action token agent ids for Dr. MAS (None when the batch has a single agent)."""
    per_episode = episode_agent_ids(batch)
    return None if per_episode is None else per_episode[tb.act_episode.numpy()]


def turn_rewards(batch: Batch, e: int) -> np.ndarray | None:
    """Episode e's reward after each of its turns, or None from a buffer that does not send them."""
    offsets = np.asarray(batch.turn_offsets)
    if offsets.size != len(batch.episode_ids) + 1:
        return None
    return np.asarray(batch.turn_rewards[offsets[e]:offsets[e + 1]], np.float64)


def turn_observations(batch: Batch) -> dict[tuple[int, int], bytes]:
    """(episode, turn) -> the turn's observation: the bytes of the tokens the environment added before the
    turn's action (its tokens outside the action mask), GiGPO's identity of a state. Turns without any are
    absent."""
    obs = np.nonzero(np.asarray(batch.action_mask) == 0)[0]
    episode = np.searchsorted(batch.episode_offsets, obs, side="right") - 1
    turn = np.asarray(batch.turn_index)[obs]
    order = np.lexsort((turn, episode))  # stable: each turn's observation tokens in their order
    obs, episode, turn = obs[order], episode[order], turn[order]
    starts = np.nonzero(np.r_[True, (episode[1:] != episode[:-1]) | (turn[1:] != turn[:-1])])[0]
    ends = np.r_[starts[1:], len(obs)]
    tokens = np.asarray(batch.tokens)
    return {(int(episode[a]), int(turn[a])): tokens[obs[a:b]].tobytes() for a, b in zip(starts, ends)}


def turn_groups(tb: TensorBatch) -> torch.Tensor:
    """A dense id per (episode, turn) for every action token, in first-appearance order."""
    key = tb.act_episode * (int(tb.act_turn.max()) + 1 if tb.act_turn.numel() else 1) + tb.act_turn
    _, inverse = torch.unique(key, return_inverse=True)
    return inverse


def value_positions(estimator: str, tb: TensorBatch) -> torch.Tensor:
    """[N] bool: the action tokens whose position the critic is trained on (one per turn for turn_gae and turn_td,
    every action token for token_gae; never a segment's bootstrap token, where it is only read). Structure only:
    known before any value is."""
    if estimator == "token_gae":
        mask = torch.ones(tb.act_tokens.numel(), dtype=torch.bool)
    else:
        mask = torch.zeros(tb.act_tokens.numel(), dtype=torch.bool)
        mask[np.unique(turn_groups(tb).numpy(), return_index=True)[1]] = True
    return mask & tb.act_trained if tb.act_trained is not None else mask


def cut_positions(batch: Batch) -> np.ndarray:
    """[episodes] where the critic reads the value of the observation at a truncated episode's cut: the position,
    in the episode's row, of the last token of the environment's reply to the last move (V of the state before
    token p is read at p - 1, so the state after the whole row is read at its last token); -1 where the batch
    holds no such reply. An episode the actor cut at its turn or context budget closes with a chunk that carries
    that reply and no action; one the environment truncated ends with the last move's own chunk, and the reply
    never travels."""
    offsets = np.asarray(batch.episode_offsets, np.int64)
    n_eps = len(offsets) - 1
    out = np.full(n_eps, -1, np.int64)
    if len(batch.truncated) != n_eps or n_eps == 0:
        return out
    lengths = np.diff(offsets)
    ends_on_reply = np.zeros(n_eps, bool)
    nonempty = lengths > 0
    ends_on_reply[nonempty] = np.asarray(batch.action_mask)[offsets[1:][nonempty] - 1] == 0
    cut = np.asarray(batch.truncated, bool) & ends_on_reply
    out[cut] = lengths[cut] - 1
    return out


def for_config(cfg: LearnerSection, tracker: SpoTracker, batch: Batch, tb: TensorBatch,
               old_values: torch.Tensor | None, agent_ids: np.ndarray | None,
               episodes: np.ndarray | None = None, cut_values: torch.Tensor | None = None) -> Advantages:
    """`compute` with a run's learner settings."""
    return compute(cfg.estimator, batch, tb, tracker=tracker, spo_normalize=cfg.spo.normalize, gamma=cfg.critic.gamma,
                   lam=cfg.critic.lam, old_values=old_values, agent_ids=agent_ids, episodes=episodes,
                   gigpo=cfg.gigpo, mars=cfg.mars, cut_values=cut_values)


def compute(estimator: str, batch: Batch, tb: TensorBatch, *, tracker: SpoTracker, spo_normalize: str,
            gamma: float, lam: float, old_values: torch.Tensor | None, agent_ids: np.ndarray | None = None,
            episodes: np.ndarray | None = None, gigpo: GigpoSection | None = None,
            mars: MarsSection | None = None, cut_values: torch.Tensor | None = None) -> Advantages:
    """`old_values`: critic values at every action token's position (value-based estimators only). After an
    episode's last turn V is 0, unless it was truncated: then `cut_values` (per episode, the critic's value at
    `cut_positions`; NaN, or None for all, where there is none). A truncated episode without one holds its last
    turn's critic target at the critic's own value and gives that turn no advantage: its turns before bootstrap
    from the last turn's value, and what followed the last turn is not known.
    After a segment of an open episode (Batch.bootstrap_turns), V is the critic's value before its bootstrap
    token, which gets no advantage and no critic target.
    `agent_ids`: per action token, for Dr. MAS agent-wise normalisation.
    `episodes`: value-based only: compute (and whiten) these episodes alone, e.g. one micro-batch's
    (critic.whiten = "microbatch"); the other tokens' entries stay 0.
    `gigpo`, `mars`: learner.gigpo's and learner.mars's settings (default: their defaults); `gamma` is the
    critic's, which neither reads.
    """
    if estimator in ("spo", "grpo", "rloo"):
        return _from_outcomes(estimator, batch, tb, tracker, spo_normalize, agent_ids)
    if estimator == "gigpo":
        return _from_gigpo(batch, tb, gigpo or GigpoSection(), agent_ids)
    if estimator == "mars":
        return _from_mars(batch, tb, mars or MarsSection(), agent_ids)
    if estimator not in VALUE_BASED:
        raise ValueError(f"unknown estimator {estimator!r}; known: {', '.join(ESTIMATORS)}")
    assert old_values is not None, f"{estimator} needs critic values"
    cut = np.full(tb.num_episodes, np.nan) if cut_values is None else cut_values.double().numpy()
    return _from_critic(estimator, batch, tb, old_values.double().numpy(), cut, gamma,
                        0.0 if estimator == "turn_td" else lam, agent_ids, episodes)


def _from_outcomes(estimator: str, batch: Batch, tb: TensorBatch, tracker: SpoTracker, spo_normalize: str,
                   agent_ids: np.ndarray | None) -> Advantages:
    """One advantage per episode from its return and a baseline, broadcast to its action tokens."""
    returns = np.asarray(batch.returns, np.float64)
    n_eps = tb.num_episodes
    if estimator == "spo":
        baselines = tracker.values(batch.prompt_keys)  # read before the update
        episode_adv = normalize_advantages(returns - baselines, tb.tokens_per_episode, spo_normalize)
        baseline_mean = float(baselines.mean()) if n_eps else 0.0
    else:
        fn = grpo_advantages if estimator == "grpo" else rloo_advantages
        episode_adv, baseline_mean = fn(returns, batch.prompt_keys), float(returns.mean()) if n_eps else 0.0
    return _per_token(episode_adv[tb.act_episode.numpy()], agent_ids, baseline_mean)


def _per_token(token: np.ndarray, agent_ids: np.ndarray | None, baseline_mean: float) -> Advantages:
    """Critic-free advantages of the action tokens, Dr. MAS-normalised per agent when asked."""
    if agent_ids is not None:
        token = agentwise_normalize(token, agent_ids)
    return Advantages(torch.from_numpy(token.astype(np.float32)), baseline_mean=baseline_mean)


def _from_gigpo(batch: Batch, tb: TensorBatch, settings: GigpoSection, agent_ids: np.ndarray | None) -> Advantages:
    """GiGPO: each turn's action tokens get its episode's group term plus omega times the turn's step term
    (docs/estimators.md, "GiGPO")."""
    observed = turn_observations(batch)
    offsets, turn_index = np.asarray(batch.episode_offsets), np.asarray(batch.turn_index)
    rewards, observations = [], []
    for e in range(tb.num_episodes):
        turns = turn_index[offsets[e]:offsets[e + 1]]
        r = _rewards_of_turns(batch, e, int(turns.max()) + 1 if turns.size else 0)
        rewards.append(r)
        # a turn the environment added nothing before stands alone (its state is not told apart)
        observations.append([observed.get((e, h), ("no observation", e, h)) for h in range(len(r))])
    terms = gigpo_advantages(batch.returns, batch.prompt_keys, rewards, observations, settings.gamma, settings.omega,
                             settings.normalize == "std")
    first_turn = np.cumsum([0] + [len(r) for r in rewards])[:-1]
    token = terms.total[first_turn[tb.act_episode.numpy()] + tb.act_turn.numpy()]
    return _per_token(token, agent_ids, float(np.mean(batch.returns)) if tb.num_episodes else 0.0)


def _from_mars(batch: Batch, tb: TensorBatch, settings: MarsSection, agent_ids: np.ndarray | None) -> Advantages:
    """MARS: each trained turn's reward-to-go, against its agent's mean over the batch's trained turns (or, with
    baseline "group", its game group's turns of the same seat), on the turn's action tokens, whitened
    (docs/estimators.md, "MARS"). A turn without action tokens (the closing turn
    that brings a loser its -1) adds its reward to the turns before it and is not compared itself."""
    turn_of_token = turn_groups(tb).numpy()
    _, first = np.unique(turn_of_token, return_index=True)  # dense turn id -> its first action token
    episode, turn = tb.act_episode.numpy()[first], tb.act_turn.numpy()[first]
    offsets, turn_index = np.asarray(batch.episode_offsets), np.asarray(batch.turn_index)
    to_go = {}
    for e in np.unique(episode):
        turns = turn_index[offsets[e]:offsets[e + 1]]
        to_go[e] = discounted_returns(_rewards_of_turns(batch, e, int(turns.max()) + 1), settings.gamma)
    returns = np.array([to_go[e][h] for e, h in zip(episode, turn)])
    agents = np.asarray(batch.agent_ids)
    agents = agents[episode] if agents.size == tb.num_episodes else np.zeros(len(episode), np.int64)
    if settings.baseline == "group":  # a game group's episodes share a prompt key (its seat suffix included)
        labels = np.unique([f"{agent}\0{batch.prompt_keys[e]}" for agent, e in zip(agents, episode)],
                           return_inverse=True)[1]
    else:
        labels = agents
    per_turn = mars_advantages(returns, labels, settings.normalize == "std")
    token = whiten(per_turn[turn_of_token])
    return _per_token(token, agent_ids, float(returns.mean()) if returns.size else 0.0)


def _rewards_of_turns(batch: Batch, e: int, n_turns: int) -> np.ndarray:
    """Episode e's reward after each turn; from a buffer that does not send them, its return after the last."""
    per_turn = turn_rewards(batch, e)
    if per_turn is not None and len(per_turn) >= n_turns:
        return per_turn
    rewards = np.zeros(n_turns)
    if n_turns:
        rewards[-1] = float(batch.returns[e])
    return rewards


def _from_critic(estimator: str, batch: Batch, tb: TensorBatch, v: np.ndarray, cut: np.ndarray, gamma: float,
                 lam: float, agent_ids: np.ndarray | None, episodes: np.ndarray | None) -> Advantages:
    """GAE over each episode's steps (turns, or action tokens), each step's advantage on its action tokens. An
    episode served to the critic alone gets its critic targets and no advantage."""
    ep_of = tb.act_episode.numpy()
    n_eps = tb.num_episodes
    truncated = np.asarray(batch.truncated, bool) if len(batch.truncated) == n_eps else np.zeros(n_eps, bool)
    trained = tb.act_trained.numpy() if tb.act_trained is not None else np.ones(len(ep_of), bool)
    adv, targets, value_mask = np.zeros(len(ep_of)), np.zeros(len(ep_of)), np.zeros(len(ep_of), bool)
    held = np.zeros(len(ep_of), bool)  # the last turn of a truncated episode without a value at its cut
    groups = np.arange(len(ep_of)) if estimator == "token_gae" else turn_groups(tb).numpy()
    for e in range(n_eps) if episodes is None else episodes:
        idx = np.nonzero((ep_of == e) & trained)[0]  # this episode's trained action tokens, in order
        if idx.size == 0:
            continue
        # one step per turn (its first action token is the boundary) or per action token
        _, first = np.unique(groups[idx], return_index=True)
        first = np.sort(first)
        boundary = idx[first]
        bootstrap = np.nonzero((ep_of == e) & ~trained)[0]
        rewards, steps = _step_rewards(batch, tb, e, boundary, gamma), len(boundary)
        if bootstrap.size:  # a segment: the rest of the episode is worth what the critic sees before it
            tail = float(v[bootstrap[0]])
        elif truncated[e] and np.isfinite(cut[e]):  # cut off, not ended: worth what the critic sees at the cut
            tail = float(cut[e])
        elif truncated[e]:  # no value at the cut: the last turn bootstraps the ones before it and teaches nothing
            turn_of_step = tb.act_turn.numpy()[boundary]
            steps = int(np.searchsorted(turn_of_step, turn_of_step[-1]))
            tail = float(v[boundary[steps]])
            targets[boundary[steps:]] = v[boundary[steps:]]  # the critic's own value: no gradient
            held[idx[first[steps]:]] = True
        else:
            tail = 0.0
        a, g = gae(rewards[:steps], v[boundary[:steps]], gamma, lam, bootstrap=tail)
        step_index = np.searchsorted(first, np.arange(idx.size), side="right") - 1
        kept = step_index < steps
        adv[idx[kept]] = a[step_index[kept]]  # broadcast each step's advantage to its action tokens
        targets[boundary[:steps]] = g
        value_mask[boundary] = True
    part = trained if episodes is None else np.isin(ep_of, episodes) & trained
    if tb.act_critic_only is not None:  # not in place: `trained` is a view of the batch's tensor
        part = part & ~tb.act_critic_only.numpy()
    part = part & ~held
    token = np.zeros(len(ep_of))
    token[part] = agentwise_normalize(adv[part], agent_ids[part]) if agent_ids is not None else whiten(adv[part])
    return Advantages(torch.from_numpy(token.astype(np.float32)), torch.from_numpy(value_mask),
                      torch.from_numpy(targets.astype(np.float32)), baseline_mean=float(v[value_mask].mean())
                      if value_mask.any() else 0.0)


def _step_rewards(batch: Batch, tb: TensorBatch, e: int, boundary: np.ndarray, gamma: float) -> np.ndarray:
    """Episode e's reward after each of its steps (`boundary`: each step's first action token).

    A turn without any action token (the closing chunk that brings the side that did not move last its outcome,
    the loser's -1; the chunk that closes a truncated episode) has no step of its own: its reward goes to the last
    step before it, discounted by the turns between, as MARS's reward-to-go counts it. A segment's bootstrap turn
    holds a token, so its reward stays with the item that trains it."""
    rewards = np.zeros(len(boundary))
    per_turn = turn_rewards(batch, e)
    turn_of_step = tb.act_turn.numpy()[boundary]
    if per_turn is None or len(per_turn) <= turn_of_step.max():
        rewards[-1] = float(batch.returns[e])  # only the episode return is known: it arrives after the last turn
        return rewards
    # each turn's reward lands on that turn's last step (its only step for turn_gae)
    last_step_of_turn = np.nonzero(np.append(turn_of_step[1:] != turn_of_step[:-1], True))[0]
    rewards[last_step_of_turn] = per_turn[turn_of_step[last_step_of_turn]]
    with_tokens = np.unique(tb.act_turn.numpy()[tb.act_episode.numpy() == e])
    later = np.arange(int(turn_of_step[0]) + 1, len(per_turn))
    for t in later[~np.isin(later, with_tokens)]:
        step = np.searchsorted(turn_of_step, t, side="right") - 1
        rewards[step] += gamma ** (t - int(turn_of_step[step])) * float(per_turn[t])
    return rewards
