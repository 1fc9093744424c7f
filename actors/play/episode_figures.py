"""What an environment reports about an episode in numbers: the numeric entries of the last `Step.info` the episode
got (keys the environment chooses, e.g. math_tool's `tool_calls`). The player leaves them on the `Episode` beside
its outcome; the actor observes a training episode's per key (`turnstream_actor_episode_info_values`,
actors/metrics.py) and a held-out round writes their means to eval.jsonl (actors/evaluation.py).

"success" is the outcome's (a success, counted as such), never a figure; a bool is a flag, not a number; a NaN or
an infinity is left out, as it would spoil every mean it joined.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Iterable, Mapping

OUTCOME_KEY = "success"


@dataclass(frozen=True)
class EpisodeFigures:
    values: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def from_info(cls, info: Mapping | None) -> EpisodeFigures:
        """The figures of a `Step.info`: its entries with a string key whose value is a finite real number (numpy
        scalars included), not a bool, "success" left out; none from an info that is not a mapping."""
        if not isinstance(info, Mapping):
            return cls()
        return cls({key: float(value) for key, value in info.items()
                    if isinstance(key, str) and key != OUTCOME_KEY and _is_figure(value)})


def _is_figure(value) -> bool:
    # numbers.Real takes int, float and numpy's scalars, not numpy's bool; Python's bool is an int, left out here
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class FigureMeans:
    """Per key, the mean over the episodes that reported it and how many did."""

    means: dict[str, float]
    episodes: dict[str, int]

    @classmethod
    def of(cls, figures: Iterable[EpisodeFigures]) -> FigureMeans:
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        for f in figures:
            for key, value in f.values.items():
                sums[key] = sums.get(key, 0.0) + value
                counts[key] = counts.get(key, 0) + 1
        return cls({key: sums[key] / counts[key] for key in sums}, counts)
