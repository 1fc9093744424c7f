"""What the estimators read of a batch beyond its tensors: each episode's agent, its reward after each turn, the
observation each turn acted from, and a dense id per turn."""
from __future__ import annotations

import numpy as np
import torch

from turnstream.learner.batch.tensors import TensorBatch
from turnstream.protocol.messages import Batch


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


def rewards_of_turns(batch: Batch, e: int, n_turns: int) -> np.ndarray:
    """Episode e's reward after each turn; from a buffer that does not send them, its return after the last."""
    per_turn = turn_rewards(batch, e)
    if per_turn is not None and len(per_turn) >= n_turns:
        return per_turn
    rewards = np.zeros(n_turns)
    if n_turns:
        rewards[-1] = float(batch.returns[e])
    return rewards
