"""The product's learner leaves an observation-blind attractor (in-process sampling, about half a minute).

goal_walk names the goal's direction once, in the first observation; "always walk one way" already succeeds
half the time. Under the chat template the action is predicted at the template's "assistant" token, so a
randomly initialised model starts out blind to the observation and the policy gradient first pushes every
context to one side. Without the entropy bonus the policy settles there, near-deterministic at a success of
one half; with the default bonus it reads the observation and succeeds. The same settings through the real
pipeline: BENCHMARKS.md, "The learner learns" and "The entropy bonus".
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.learner_rollouts import train_in_process
from turnstream.core.config import LearnerSection


def run(model_dir, steps: int, **learner) -> list[dict]:
    cfg = LearnerSection(device="cpu", **learner)  # the defaults otherwise: spo, lr 1e-3, entropy bonus
    return train_in_process(model_dir, "goal_walk", {}, cfg, seed=1, batch=128, max_steps=steps, stop_at=0.9)


def test_default_learner_reads_the_observation(tiny_model):
    history = run(tiny_model, 30)
    assert np.mean([h["success"] for h in history[-3:]]) >= 0.9, [round(h["success"], 2) for h in history]


@pytest.mark.parametrize("learner", [{"entropy_coef": 0.0}, {"entropy_weight": "outcome_variance"}],
                         ids=["no_bonus", "outcome_variance"])
def test_without_the_uniform_entropy_bonus_the_policy_walks_one_way(tiny_model, learner):
    """The task has the trap the default avoids: without the bonus the policy turns near-deterministic and
    observation-blind within a few steps, and sits near the one-way success of one half. Weighted by each task's
    outcome variance the bonus does not hold it either: goal_walk's task key names the direction, so in the trap
    every task's outcome is settled (always won or always lost) and its weight 4 v (1 - v) falls to zero."""
    history = run(tiny_model, 12, **learner)
    assert history[-1]["entropy"] < 0.15, [round(h["entropy"], 3) for h in history]
    assert max(h["success"] for h in history) < 0.65, [round(h["success"], 2) for h in history]
