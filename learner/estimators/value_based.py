"""What the estimators that read a value function share (turn_gae.py, token_gae.py, turn_td.py): GAE over each
episode's steps, each step's advantage broadcast to its action tokens, and the critic's targets. Like the other
critic estimators, they take episodes served to the critic alone (Batch.critic_only, buffer.critic_replay), which
get critic targets and no advantage."""
from __future__ import annotations

import numpy as np
import torch

from turnstream.learner.batch.tensors import TensorBatch
from turnstream.learner.estimators.advantages import agentwise_normalize, gae, whiten
from turnstream.learner.estimators.base import Advantages, Estimator
from turnstream.learner.estimators.episodes import turn_groups, turn_rewards
from turnstream.protocol.messages import Batch


class ValueBased(Estimator):
    """GAE with the critic's values before the update, over steps that step_groups() says (a turn, a token)."""

    needs_critic = True
    reads_learner_state = True

    @property
    def lam(self) -> float:
        """GAE's lambda."""
        return self.cfg.critic.lam

    def step_groups(self, tb: TensorBatch) -> np.ndarray:
        """[N] per action token, the id of the step it belongs to: its turn (one step per turn)."""
        return turn_groups(tb).numpy()

    def value_positions(self, tb: TensorBatch) -> torch.Tensor:
        """The first action token of each step (never a segment's bootstrap token, where the critic is only read).
        Structure only: known before any value is."""
        mask = torch.zeros(tb.act_tokens.numel(), dtype=torch.bool)
        mask[np.unique(self.step_groups(tb), return_index=True)[1]] = True
        return mask & tb.act_trained if tb.act_trained is not None else mask

    def advantages(self, batch: Batch, tb: TensorBatch, old_values: torch.Tensor | None,
                   agent_ids: np.ndarray | None, episodes: np.ndarray | None = None,
                   cut_values: torch.Tensor | None = None) -> Advantages:
        """After an episode's last turn V is 0, unless it was truncated: then `cut_values` (per episode, the
        critic's value at TensorBatch.cut_pos; NaN, or None for all, where there is none). A truncated episode
        without one holds its last turn's critic target at the critic's own value and gives that turn no advantage:
        its turns before bootstrap from the last turn's value, and what followed the last turn is not known.
        After a segment of an open episode (Batch.bootstrap_turns), V is the critic's value before its bootstrap
        token, which gets no advantage and no critic target.
        `episodes`: compute (and whiten) these episodes alone, e.g. one micro-batch's (critic.whiten =
        "microbatch"); the other tokens' entries stay 0."""
        assert old_values is not None, f"{self.name} needs critic values"
        cut = np.full(tb.num_episodes, np.nan) if cut_values is None else cut_values.double().numpy()
        return self._gae(batch, tb, old_values.double().numpy(), cut, self.cfg.critic.gamma, self.lam, agent_ids,
                         episodes)

    def _gae(self, batch: Batch, tb: TensorBatch, v: np.ndarray, cut: np.ndarray, gamma: float, lam: float,
             agent_ids: np.ndarray | None, episodes: np.ndarray | None) -> Advantages:
        """GAE over each episode's steps, each step's advantage on its action tokens. An episode served to the
        critic alone gets its critic targets and no advantage."""
        ep_of = tb.act_episode.numpy()
        n_eps = tb.num_episodes
        truncated = np.asarray(batch.truncated, bool) if len(batch.truncated) == n_eps else np.zeros(n_eps, bool)
        trained = tb.act_trained.numpy() if tb.act_trained is not None else np.ones(len(ep_of), bool)
        adv, targets, value_mask = np.zeros(len(ep_of)), np.zeros(len(ep_of)), np.zeros(len(ep_of), bool)
        held = np.zeros(len(ep_of), bool)  # the last turn of a truncated episode without a value at its cut
        groups = self.step_groups(tb)
        for e in range(n_eps) if episodes is None else episodes:
            idx = np.nonzero((ep_of == e) & trained)[0]  # this episode's trained action tokens, in order
            if idx.size == 0:
                continue
            # one step per turn (its first action token is the boundary) or per action token
            _, first = np.unique(groups[idx], return_index=True)
            first = np.sort(first)
            boundary = idx[first]
            bootstrap = np.nonzero((ep_of == e) & ~trained)[0]
            rewards, steps = step_rewards(batch, tb, e, boundary, gamma), len(boundary)
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


def step_rewards(batch: Batch, tb: TensorBatch, e: int, boundary: np.ndarray, gamma: float) -> np.ndarray:
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
