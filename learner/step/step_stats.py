"""The statistics a learner step returns (one learner.jsonl line, learner/metrics.py's gauges)."""
from __future__ import annotations

import numpy as np

from turnstream.learner.batch.tensors import TensorBatch, episode_marks
from turnstream.learner.step.packing import Dropped
from turnstream.protocol.messages import Batch


class MeanMax:
    """Statistics over several parts (micro-batches, updates): `*_max` keys keep the largest value, the
    others their mean over the parts added."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.maxes: dict[str, float] = {}
        self.parts = 0

    def add(self, stats: dict[str, float]) -> None:
        self.parts += 1
        for k, v in stats.items():
            if k.endswith("_max"):
                self.maxes[k] = max(self.maxes.get(k, -np.inf), v)
            else:
                self.sums[k] = self.sums.get(k, 0.0) + v

    def result(self) -> dict[str, float]:
        return {**{k: v / max(1, self.parts) for k, v in self.sums.items()}, **self.maxes}


def replayed_episodes(batch: Batch) -> np.ndarray:
    """[episodes] bool: the successes served again (buffer.positive_replay)."""
    return episode_marks(batch.replayed, len(batch.episode_ids))


def batch_stats(batch: Batch, tb: TensorBatch, dropped: Dropped) -> dict:
    """What the step trained on: sizes, returns, staleness, and what it dropped (with the episode ids for
    learner/main.py's audit trail and the logs)."""
    # `episodes` and `return_mean` are of the episodes that ended in this batch: a segment of an open episode
    # (buffer.segment_turns) is counted with the item that ends it, with the whole episode's return; a success
    # served again (buffer.positive_replay) is trained on but is not a new episode, nor is an episode served to
    # the critic alone (buffer.critic_replay), whose tokens are outside the policy's staleness figures too
    bootstrap = np.asarray(batch.bootstrap_turns)
    ends = bootstrap < 0 if bootstrap.size == tb.num_episodes else np.ones(tb.num_episodes, bool)
    replayed = replayed_episodes(batch)
    critic_only = episode_marks(batch.critic_only, tb.num_episodes)
    fresh = ends & ~replayed & ~critic_only
    returns = np.asarray(batch.returns, np.float64)[fresh]
    n_act = tb.act_tokens.numel()
    for_policy = ~tb.act_critic_only.numpy() if tb.act_critic_only is not None else np.ones(n_act, bool)
    staleness = (batch.learner_version - tb.act_versions).numpy()
    staleness = staleness[for_policy] if for_policy.any() else np.zeros(1, np.int64)
    out = dict(
        episodes=int(fresh.sum()), segments=int((~ends).sum()), replayed=int(replayed.sum()),
        action_tokens=int(for_policy.sum()),
        tokens=int(tb.attention_mask.sum()), return_mean=float(returns.mean()) if returns.size else 0.0,
        staleness_max=int(staleness.max()),
        staleness_mean=float(staleness.mean()),
        staleness_hist={int(k): int(v) for k, v in zip(*np.unique(staleness, return_counts=True))},
        dropped_stale=batch.dropped_stale, dropped_over_budget=len(dropped.over_budget),
        dropped_bad_tokens=len(dropped.bad_tokens))
    if critic_only.any():
        out.update(critic_only=int(critic_only.sum()), critic_turns_by_staleness=critic_turns_by_staleness(
            batch, tb, critic_only))
    if dropped.over_budget:
        out["dropped_over_budget_ids"] = [e.episode for e in dropped.over_budget]
    if dropped.bad_tokens:
        out["dropped_bad_tokens_ids"] = dropped.bad_tokens
    return out


def critic_turns_by_staleness(batch: Batch, tb: TensorBatch, critic_only: np.ndarray) -> dict[int, int]:
    """{staleness: turns} of the critic-only episodes, each at its oldest token's staleness (the buffer's measure):
    a reader compares it with the policy's bound to count what only the critic could learn from."""
    oldest = np.full(tb.num_episodes, np.iinfo(np.int64).max)
    np.minimum.at(oldest, tb.act_episode.numpy(), tb.act_versions.numpy())
    turns = np.diff(np.asarray(batch.turn_offsets)) if len(batch.turn_offsets) == tb.num_episodes + 1 else \
        np.bincount(tb.act_episode.numpy(), minlength=tb.num_episodes)  # without turn rewards: one per action token
    out: dict[int, int] = {}
    for e in np.nonzero(critic_only)[0]:
        s = int(batch.learner_version - oldest[e])
        out[s] = out.get(s, 0) + int(turns[e])
    return out
