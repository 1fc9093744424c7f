"""MARS's baseline: the seat's mean over the batch (learner.mars.baseline = "seat"), or, under group sampling, the
mean of the game group and seat each turn belongs to, as MARSHAL normalises ("group"; docs/estimators.md, "MARS")."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from turnstream.buffer.store.episodes import Episode, flatten
from turnstream.core.config import ConfigError, load_config
from tests import estimator_compute as estimators
from turnstream.learner.estimators.advantages import whiten
from turnstream.learner.estimators.spo import SpoTracker
from turnstream.learner.batch.tensors import to_tensors
from tests.unit.test_store import chunk


def _two_groups():
    """Seat 0 of two games, two episodes each, one move each: game g is played for 0 or 1, game h for 10 or 12."""
    episodes = []
    for game, returns in (("g", (0.0, 1.0)), ("h", (10.0, 12.0))):
        for i, r in enumerate(returns):
            ep = Episode(f"{game}{i}/a0", ("a", 0), f"{game}/a0")
            ep.add(chunk(seq=len(episodes), ep=ep.episode_id, turn=0, gen=(5,), reward=r, done=True,
                         prompt=ep.prompt_key))
            episodes.append(ep)
    batch = flatten(episodes, 1, 0, 0)
    return batch, to_tensors(batch, 64)


def _mars(baseline: str):
    batch, tb = _two_groups()
    settings = SimpleNamespace(gamma=1.0, normalize="mean", baseline=baseline)
    return estimators.compute("mars", batch, tb, tracker=SpoTracker(), spo_normalize="token", gamma=1.0, lam=1.0,
                              old_values=None, mars=settings).token_adv.numpy()


def test_under_group_sampling_each_game_group_and_seat_is_its_own_baseline():
    adv = _mars("group")
    np.testing.assert_allclose(adv, whiten(np.array([-0.5, 0.5, -1.0, 1.0])), atol=1e-6)
    assert adv[1] > 0  # the better of the low-stakes game's two plays is credited as better


def test_the_seat_baseline_is_the_seats_mean_over_the_batch():
    adv = _mars("seat")
    np.testing.assert_allclose(adv, whiten(np.array([0.0, 1.0, 10.0, 12.0]) - 5.75), atol=1e-6)
    assert adv[1] < 0  # the low-stakes game's winner is below the seat's mean


@pytest.mark.parametrize("overrides", [[], ["buffer.sampling=group", "tasks.group_size=1"]])
def test_a_group_baseline_needs_group_sampling(overrides):
    with pytest.raises(ConfigError) as info:
        load_config(None, ["learner.estimator=mars", "learner.mars.baseline=group", *overrides])
    assert "learner.mars.baseline" in str(info.value) and "\n" not in str(info.value)
    cfg = load_config(None, ["learner.estimator=mars", "learner.mars.baseline=group", "buffer.sampling=group",
                             "tasks.group_size=2"])
    assert cfg.learner.mars.baseline == "group"
