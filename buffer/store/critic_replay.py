"""Off-policy critic data (buffer.critic_replay, for turn_td): episodes that left the store are served again, to the
critic alone.

- Whole episodes join the pool as they are served fresh, or as the policy's staleness bound drops them (their
  turns were never trained): the critic may still learn from them, the policy may not.
- Each batch gets up to `share * batch_episodes` of them, drawn uniformly from the pool (ArCHer samples its
  replay buffer uniformly), on top of its fresh items. They are `CriticReplay` items: the batch marks them
  (`Batch.critic_only`) and the learner trains only its value function on them, in a pass of their own whose
  gradient reaches the critic's parameters alone (a shared backbone runs without gradients there) and is clipped
  apart from the policy's (learner/step/trainer.py): the policy's parameters and optimizer state end each step as
  they would without them.
- The pool holds at most `capacity` episodes (the oldest leave first) and forgets those older than the critic's
  own bound, `max_staleness` versions. It lives in memory: a restarted buffer starts with an empty pool, as it
  is only ever a second reading of data already trained or dropped.
"""
from __future__ import annotations

import random
from collections import OrderedDict

from turnstream.buffer.store.episodes import CriticReplay, Episode
from turnstream.core.config_buffer import episodes_of_batch


class CriticReplayPool:
    def __init__(self, *, share: float, max_staleness: int, capacity: int, seed: int = 0):
        self.share, self.max_staleness, self.capacity = share, max_staleness, capacity
        self.episodes: OrderedDict[str, Episode] = OrderedDict()  # oldest joined first
        self.rng = random.Random(seed)

    def keep(self, episodes: list[Episode]) -> None:
        for ep in episodes:
            self.episodes[ep.episode_id] = ep
        while len(self.episodes) > self.capacity:
            self.episodes.popitem(last=False)

    def due(self, batch_episodes: int, learner_version: int) -> list[CriticReplay]:
        """The critic-only episodes for a batch of `batch_episodes`, drawn without replacement; forgets those past
        the critic's bound first."""
        for episode_id in [i for i, ep in self.episodes.items()
                           if learner_version - ep.behaviour_version > self.max_staleness]:
            del self.episodes[episode_id]
        k = min(episodes_of_batch(self.share, batch_episodes), len(self.episodes))
        return [CriticReplay(ep) for ep in self.rng.sample(list(self.episodes.values()), k)]
