"""A truncated episode bootstraps from the critic's value of the observation at the cut, never from its own last
turn's value (docs/estimators.md, "Turn-level GAE", truncated episodes)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from turnstream.buffer.store.episodes import Episode, flatten
from tests import estimator_compute as estimators
from turnstream.learner.batch.tensors import cut_positions
from turnstream.learner.estimators.spo import SpoTracker
from turnstream.learner.batch.tensors import to_tensors
from tests.unit.test_store import chunk

GAMMA = 0.9


def _truncated(*, reply_travels: bool):
    """Two moves (rewards 0 and 0.5), then the cut. Cut by the actor's turn or context budget, the closing chunk
    carries the environment's reply to the last move and no action; cut by the environment, the last move's
    chunk itself is the truncated one and the reply never travels."""
    ep = Episode("e", ("a", 0), "p")
    for t, r in enumerate([0.0, 0.5]):
        last = t == 1 and not reply_travels
        c = chunk(seq=t, ep="e", turn=t, obs=(1, 2), gen=(5, 6), reward=r, done=last)
        c.truncated = last
        ep.add(c)
    if reply_travels:
        c = chunk(seq=2, ep="e", turn=2, obs=(7, 8, 9), gen=(), reward=0.0, done=True)
        c.truncated = True
        ep.add(c)
    batch = flatten([ep], 1, 0, 0)
    assert batch.truncated.tolist() == [True]
    return batch, to_tensors(batch, 64)


def _compute(estimator, batch, tb, values, cut_values=None, lam=0.0):
    return estimators.compute(estimator, batch, tb, tracker=SpoTracker(), spo_normalize="token", gamma=GAMMA,
                              lam=lam, old_values=torch.tensor(values), cut_values=cut_values)


def test_the_cut_is_read_at_the_last_token_of_the_environments_reply():
    batch, tb = _truncated(reply_travels=True)
    assert cut_positions(batch).tolist() == [int(tb.lengths[0]) - 1]  # the reply's last token
    batch, tb = _truncated(reply_travels=False)
    assert cut_positions(batch).tolist() == [-1]  # nothing of the state after the cut travelled


@pytest.mark.parametrize("estimator", ["turn_gae", "turn_td"])
def test_a_truncated_last_turns_one_step_target_is_its_reward_plus_the_discounted_value_at_the_cut(estimator):
    batch, tb = _truncated(reply_travels=True)
    adv = _compute(estimator, batch, tb, [0.2, 9.0, 0.4, 9.0], cut_values=torch.tensor([0.6]))
    targets = adv.value_targets.numpy()[adv.value_mask.numpy()]
    np.testing.assert_allclose(targets, [0.0 + GAMMA * 0.4, 0.5 + GAMMA * 0.6], atol=1e-6)  # not 0.5 + GAMMA * 0.4


def test_token_gae_bootstraps_its_last_action_token_from_the_cut():
    batch, tb = _truncated(reply_travels=True)
    adv = _compute("token_gae", batch, tb, [0.2, 0.3, 0.4, 0.45], cut_values=torch.tensor([0.6]))
    assert adv.value_targets.numpy()[-1] == pytest.approx(0.5 + GAMMA * 0.6, abs=1e-6)


def test_without_a_value_at_the_cut_the_last_turn_teaches_nothing_and_bootstraps_the_turns_before_it():
    """The environment cut the episode: its last turn's target would refer to itself, so it is held at the
    critic's own value (no gradient) and gets no advantage; the turn before it bootstraps from its value."""
    batch, tb = _truncated(reply_travels=False)
    adv = _compute("turn_gae", batch, tb, [0.2, 9.0, 0.4, 9.0], cut_values=torch.tensor([float("nan")]))
    targets = adv.value_targets.numpy()[adv.value_mask.numpy()]
    np.testing.assert_allclose(targets, [0.0 + GAMMA * 0.4, 0.4], atol=1e-6)
    assert adv.token_adv.numpy()[2:].tolist() == [0.0, 0.0]
    without = _compute("turn_gae", batch, tb, [0.2, 9.0, 0.4, 9.0])  # no value at any cut: the same
    np.testing.assert_allclose(without.value_targets.numpy(), adv.value_targets.numpy())
