"""The mistake share at which a task's solver succeeds at a chosen rate.

A model trained to convergence on the solver's transcripts answers as the solver does, a mistake with the same
probability per answer, so its success at the actors' temperature of 1 is the solver's. How a share of mistakes
per answer becomes a success rate depends on the task (goal_walk fails at the first mistake, a trail forgives
ten of its sixty turns), so the share is found per task: a bisection on the solver's success over a fixed set
of episodes, which falls as the share rises.
"""
from __future__ import annotations

from dataclasses import dataclass

from turnstream.warm_start.episodes import WarmTask, play_many

CALIBRATION_EPISODES = 400
STEPS = 12  # bisection steps: the share to within 1/4096
# Self-play, where an episode succeeds when either side wins: the solver playing both sides well draws, so no
# success rate measures one side's play, and the share is fixed instead (half the moves the solver's, half random)
FIXED_MISTAKES = {"tictactoe": 0.5}


@dataclass(frozen=True)
class Calibrated:
    mistakes: float  # the share of answers that are mistakes
    success: float  # the solver's success at that share, over the calibration episodes


def solver_success(task: WarmTask, mistakes: float, episodes: int = CALIBRATION_EPISODES) -> float:
    played = play_many(task, range(episodes), mistakes)
    return sum(p.success for p in played) / len(played)


def mistakes_for(task: WarmTask, success: float, episodes: int = CALIBRATION_EPISODES) -> Calibrated:
    """The largest share of mistakes at which the solver still succeeds at least `success` of the time (0 when
    even the solver without mistakes falls short); a self-play task's fixed share (FIXED_MISTAKES)."""
    if task.env in FIXED_MISTAKES:
        return Calibrated(FIXED_MISTAKES[task.env], solver_success(task, FIXED_MISTAKES[task.env], episodes))
    low, high = 0.0, 1.0
    at_high = solver_success(task, high, episodes)
    if at_high >= success:
        return Calibrated(high, at_high)
    for _ in range(STEPS):
        middle = (low + high) / 2
        if solver_success(task, middle, episodes) >= success:
            low = middle
        else:
            high = middle
    return Calibrated(round(low, 4), solver_success(task, round(low, 4), episodes))
