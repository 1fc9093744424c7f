"""The critic estimators credit every reward: in self-play the side that did not move last gets its outcome on a
closing chunk without action tokens, and that reward reaches its last turn with tokens, discounted by the turns
between (docs/estimators.md, "Turn-level GAE", "Token-level GAE")."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from turnstream.buffer.store.episodes import Episode, flatten
from tests import estimator_compute as estimators
from turnstream.learner.estimators.advantages import gae, whiten
from turnstream.learner.estimators.spo import SpoTracker
from turnstream.learner.batch.tensors import to_tensors
from tests.unit.test_store import chunk

GAMMA, LAM = 0.9, 0.8


def _self_play(gen_per_turn: tuple[int, ...]):
    """Game 1: X (agent 0) wins with its third move, O (agent 1) gets -1 on a closing chunk after its two moves.
    Game 2: O wins with its second move, X gets -1 on its closing chunk. Every move holds `gen_per_turn` tokens."""
    games = {("g1", 0): [0.0, 0.0, 1.0], ("g1", 1): [0.0, 0.0, "close", -1.0],
             ("g2", 0): [0.0, 0.0, "close", -1.0], ("g2", 1): [0.0, 1.0]}
    episodes = []
    for (game, agent), plan in games.items():
        ep = Episode(f"{game}/a{agent}", ("a", 0), f"tictactoe/a{agent}")
        closing = "close" in plan
        rewards = [r for r in plan if r != "close"]
        for t, r in enumerate(rewards):
            last = t == len(rewards) - 1
            gen = () if closing and last else tuple(range(5, 5 + gen_per_turn[0]))
            c = chunk(seq=len(episodes) * 10 + t, ep=ep.episode_id, turn=t, gen=gen, obs=() if not gen else (1, 2),
                      reward=r, done=last, prompt=ep.prompt_key)
            c.agent_id = agent
            ep.add(c)
        episodes.append(ep)
    batch = flatten(episodes, 1, 0, 0)
    return batch, to_tensors(batch, 64)


# each episode's reward per step, the closing -1 on the loser's last move at one turn's discount
STEP_REWARDS = [[0.0, 0.0, 1.0], [0.0, -GAMMA], [0.0, -GAMMA], [0.0, 1.0]]


@pytest.mark.parametrize("estimator", ["turn_gae", "turn_td"])
def test_a_losers_closing_reward_reaches_its_last_move(estimator):
    batch, tb = _self_play((1,))
    assert batch.action_mask.sum() == 9  # the two closing chunks carry no action token
    values = torch.zeros(9)
    adv = estimators.compute(estimator, batch, tb, tracker=SpoTracker(), spo_normalize="token", gamma=GAMMA,
                             lam=LAM, old_values=values)
    lam = 0.0 if estimator == "turn_td" else LAM
    want_adv, want_targets = zip(*(gae(r, np.zeros(len(r)), GAMMA, lam) for r in STEP_REWARDS))
    targets = adv.value_targets.numpy()
    np.testing.assert_allclose(targets, np.concatenate(want_targets), atol=1e-6)
    losers = np.r_[3:5, 5:7]  # O's moves in game 1, X's in game 2
    assert (targets[losers][[1, 3]] < 0).all()  # the loser's last move is worth less than nothing
    np.testing.assert_allclose(adv.token_adv.numpy(), whiten(np.concatenate(want_adv)), atol=1e-5)
    assert (adv.token_adv.numpy()[losers] < 0).all()


def test_token_gae_puts_the_closing_reward_on_the_last_action_token():
    batch, tb = _self_play((2,))
    values = torch.zeros(18)
    adv = estimators.compute("token_gae", batch, tb, tracker=SpoTracker(), spo_normalize="token", gamma=GAMMA,
                             lam=LAM, old_values=values)
    per_token = [np.repeat(0.0, 2 * (len(r) - 1)).tolist() + [0.0, r[-1]] for r in STEP_REWARDS]
    want_adv, want_targets = zip(*(gae(r, np.zeros(len(r)), GAMMA, LAM) for r in per_token))
    np.testing.assert_allclose(adv.value_targets.numpy(), np.concatenate(want_targets), atol=1e-6)
    assert adv.value_targets.numpy()[9] == pytest.approx(-GAMMA)  # O's last token in game 1
    np.testing.assert_allclose(adv.token_adv.numpy(), whiten(np.concatenate(want_adv)), atol=1e-5)


def test_a_segments_bootstrap_turn_keeps_its_reward_for_the_next_item():
    """Only turns without any token fold: a segment's bootstrap turn holds its first token, and its reward is
    credited where that turn is trained, in the next item."""
    from turnstream.buffer.store.episodes import Segment
    ep = Episode("e", ("a", 0), "p")
    for t, r in enumerate([0.25, 2.0]):
        ep.add(chunk(seq=t, ep="e", turn=t, gen=(5, 6), reward=r, done=False))
    batch = flatten([Segment(ep, 0, 1, 0.0)], 1, 0, 0)
    tb = to_tensors(batch, 64)
    assert tb.act_trained.tolist() == [True, True, False]
    adv = estimators.compute("turn_gae", batch, tb, tracker=SpoTracker(), spo_normalize="token", gamma=GAMMA,
                             lam=LAM, old_values=torch.tensor([0.0, 9.0, 0.3]))
    assert adv.value_targets.numpy()[0] == pytest.approx(0.25 + GAMMA * 0.3, abs=1e-6)
