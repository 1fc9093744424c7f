"""Positive replay (EvoCUA): a rare success on a hard task is served again, so that it keeps teaching the policy.

- Pass rates: per task (prompt_key), the share of its newest `window` complete episodes whose return reached
  `success_return`. Every complete episode counts, whether it is served or dropped as stale; replays do not.
- Kept: a whole episode served fresh that succeeded on a task whose pass rate (its own outcome included) is
  below `hard_below`.
- Served again: each batch may hold up to `share` of its episodes as replays of kept successes, the oldest kept
  first, each at most `max_replays` times, and only while it is within the staleness bound
  (learner_version - its oldest token's version <= max_staleness): the policy loss never sees older tokens than
  it would from fresh data. A kept success past the bound, or replayed `max_replays` times, is forgotten.
- A replay is a `Replay` item (buffer/store/episodes.py): the batch marks it (`Batch.replayed`), the learner
  does not count it as a new episode (its success figures, the SPO tracker), the store does not count it as a
  sample, the write-ahead log does not consume it again, and the audit trail notes it apart from what was served.
- Memory only: a restarted buffer starts with no kept successes and empty pass rates (both refill as episodes
  arrive); what the log must make durable is what the actors sent, and nothing here is.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from turnstream.buffer.store.episodes import Episode, Replay
from turnstream.core.config_buffer import episodes_of_batch


@dataclass
class PassRate:
    successes: int
    episodes: int

    @property
    def rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0


class PassRates:
    """The share of each task's newest `window` complete episodes that succeeded."""

    def __init__(self, window: int, success_return: float):
        self.window, self.success_return = window, success_return
        self.outcomes: dict[str, deque[bool]] = {}

    def succeeded(self, ep: Episode) -> bool:
        return ep.episode_return >= self.success_return

    def add(self, ep: Episode) -> None:
        self.outcomes.setdefault(ep.prompt_key, deque(maxlen=self.window)).append(self.succeeded(ep))

    def of(self, prompt_key: str) -> PassRate:
        outcomes = self.outcomes.get(prompt_key, ())
        return PassRate(sum(outcomes), len(outcomes))

    def table(self) -> dict[str, PassRate]:
        """Every task seen, hardest first."""
        rates = {key: self.of(key) for key in self.outcomes}
        return dict(sorted(rates.items(), key=lambda kv: (kv[1].rate, kv[0])))


class PositiveReplay:
    def __init__(self, *, share: float, hard_below: float, success_return: float, window: int, max_replays: int):
        self.share, self.hard_below, self.max_replays = share, hard_below, max_replays
        self.pass_rates = PassRates(window, success_return)
        self.kept: OrderedDict[str, Replay] = OrderedDict()  # oldest kept first
        self.completed_episodes = 0

    def completed(self, ep: Episode) -> None:
        """A complete episode arrived: one more outcome of its task."""
        self.pass_rates.add(ep)
        self.completed_episodes += 1

    def worth_keeping(self, ep: Episode) -> bool:
        """Whether a whole episode about to be served fresh is a success on a hard task."""
        return self.pass_rates.succeeded(ep) and self.pass_rates.of(ep.prompt_key).rate < self.hard_below

    def keep(self, episodes: list[Episode]) -> None:
        for ep in episodes:
            self.kept[ep.episode_id] = Replay(ep)

    def due(self, batch_episodes: int, learner_version: int, max_staleness: int) -> list[Replay]:
        """The replays the next batch of `batch_episodes` may hold (not yet counted as served); forgets the kept
        successes past the staleness bound."""
        for episode_id in [i for i, r in self.kept.items() if learner_version - r.behaviour_version > max_staleness]:
            del self.kept[episode_id]
        return list(self.kept.values())[:episodes_of_batch(self.share, batch_episodes)]

    def replayed(self, replays: list[Replay]) -> None:
        """`replays` left in a batch: each has one use fewer."""
        for r in replays:
            r.uses += 1
            if r.uses >= self.max_replays:
                self.kept.pop(r.episode_id, None)
