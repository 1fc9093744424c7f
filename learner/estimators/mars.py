"""MARS (`mars`): each turn's reward-to-go against the mean of its agent's turns in the batch (MARS's turn-level,
agent-specific advantage for self-play), whitened."""
from __future__ import annotations

import numpy as np
import torch

from turnstream.learner.batch.tensors import TensorBatch
from turnstream.learner.estimators.advantages import discounted_returns, mars_advantages, whiten
from turnstream.learner.estimators.base import Advantages, Estimator, per_token
from turnstream.learner.estimators.episodes import rewards_of_turns, turn_groups
from turnstream.protocol.messages import Batch


class Mars(Estimator):
    """MARS: each trained turn's reward-to-go, against its agent's mean over the batch's trained turns (or, with
    baseline "group", its game group's turns of the same seat), on the turn's action tokens, whitened
    (docs/estimators.md, "MARS"). A turn without action tokens (the closing turn
    that brings a loser its -1) adds its reward to the turns before it and is not compared itself."""

    name = "mars"

    def advantages(self, batch: Batch, tb: TensorBatch, old_values: torch.Tensor | None,
                   agent_ids: np.ndarray | None, episodes: np.ndarray | None = None,
                   cut_values: torch.Tensor | None = None) -> Advantages:
        settings = self.cfg.mars
        turn_of_token = turn_groups(tb).numpy()
        _, first = np.unique(turn_of_token, return_index=True)  # dense turn id -> its first action token
        episode, turn = tb.act_episode.numpy()[first], tb.act_turn.numpy()[first]
        offsets, turn_index = np.asarray(batch.episode_offsets), np.asarray(batch.turn_index)
        to_go = {}
        for e in np.unique(episode):
            turns = turn_index[offsets[e]:offsets[e + 1]]
            to_go[e] = discounted_returns(rewards_of_turns(batch, e, int(turns.max()) + 1), settings.gamma)
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
        return per_token(token, agent_ids, float(returns.mean()) if returns.size else 0.0)
