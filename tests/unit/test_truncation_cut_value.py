"""A truncated episode whose batch holds the environment's reply at the cut bootstraps, through the learner's
step, from the critic's value there (docs/estimators.md, "Turn-level GAE", truncated episodes): the learner reads
V at the reply's last token in the same forward that reads the values before the actions, in every way the step
gets its values (the training forward, a no-grad pass over several micro-batches, a separate critic)."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tests.learner_batches import synthetic_batch, tiny_causal_lm
from tests.unit.test_store import chunk
from turnstream.buffer.store.episodes import Episode, flatten
from turnstream.core.config import LearnerSection
from turnstream.learner.batch.tensors import to_tensors
from turnstream.learner.step.trainer import Trainer

LAST_REWARD = 0.5


def batch_with_a_cut():
    """Three finished episodes and one the actor cut at its turn budget after two moves: its closing chunk carries
    the environment's reply to the last move and no action."""
    episodes = []
    for e in range(3):
        ep = Episode(f"f{e}", ("a", 0), f"q{e}")
        ep.add(chunk(seq=10 * e, ep=f"f{e}", turn=0, obs=(3, 4, 9 + e), gen=(5,), reward=float(e % 2), done=True,
                     allowed=(5, 6)))
        episodes.append(ep)
    cut = Episode("cut", ("a", 0), "q-cut")
    for t, r in enumerate([0.0, LAST_REWARD]):
        cut.add(chunk(seq=100 + t, ep="cut", turn=t, obs=(11, 12 + t), gen=(6, 5), reward=r, allowed=(5, 6)))
    closing = chunk(seq=102, ep="cut", turn=2, obs=(21, 22, 23), gen=(), done=True)
    closing.truncated = True
    cut.add(closing)
    episodes.append(cut)
    batch = flatten(episodes, 1, 0, 0)
    assert batch.truncated.tolist() == [False, False, False, True]
    return batch


def value_after_the_whole_row(trainer: Trainer, ids: torch.Tensor) -> float:
    """V of the state after every token of the row, read on its own (one row, nothing batched with it)."""
    net = trainer.net
    with torch.no_grad():
        if net.head is not None:
            hidden = net.model(input_ids=ids[None], output_hidden_states=True).hidden_states[-1]
            return float(net.head(hidden)[0, -1])
        return float(net.critic(input_ids=ids[None])[0, -1])


@pytest.mark.parametrize("mode, whiten, fields", [
    ("shared", "auto", {}),  # the default: one micro-batch, values from the training forward
    ("shared", "auto", {"max_tokens_per_microbatch": 12}),  # several micro-batches, values from a no-grad pass
    ("shared", "microbatch", {"max_tokens_per_microbatch": 12}),  # several, each its training forward's values
    ("shared", "auto", {"max_tokens_per_microbatch": 12, "pack_sequences": True}),  # packed rows
    ("separate", "auto", {"max_tokens_per_microbatch": 12}),
])
def test_the_last_turn_of_a_cut_episode_targets_its_reward_plus_the_discounted_value_at_the_cut(mode, whiten, fields,
                                                                                              tmp_path):
    cfg = LearnerSection(estimator="turn_gae", lr=1e-2, device="cpu", **fields)
    cfg.critic.mode, cfg.critic.whiten = mode, whiten
    model = tiny_causal_lm()
    model.save_pretrained(tmp_path / "critic")
    trainer = Trainer(copy.deepcopy(model), cfg, critic_path=str(tmp_path / "critic"))
    trainer.step(synthetic_batch(6, seed=1, turns=(1, 2)))  # the value head is no longer zero

    batch = batch_with_a_cut()
    tb = to_tensors(batch, 64)
    row = tb.input_ids[3, :int(tb.lengths[3])]
    v_cut = value_after_the_whole_row(trainer, row)
    assert abs(v_cut) > 1e-4  # a zero would pass for "no bootstrap"

    seen = []
    advantages = trainer.estimator.advantages

    def spy(*args, **kwargs):
        out = advantages(*args, **kwargs)
        seen.append(out)
        return out

    trainer.estimator.advantages = spy
    trainer.step(batch)

    last_turn = (tb.act_episode == 3) & (tb.act_turn == 1)
    first_token = torch.nonzero(last_turn)[0, 0]
    got, = [a for a in seen if a.value_mask[first_token]]  # the whole batch's, or its micro-batch's
    gamma = cfg.critic.gamma
    assert float(got.value_targets[first_token]) == pytest.approx(LAST_REWARD + gamma * v_cut, abs=1e-5)
    assert bool((got.token_adv[last_turn] != 0).all())  # the last turn is trained, not held


def test_an_episode_the_environment_truncated_reads_no_value_at_a_cut():
    """Its last chunk is the last move's own: the reply never travelled, so there is nothing to read."""
    ep = Episode("env-cut", ("a", 0), "q")
    for t in range(2):
        c = chunk(seq=t, ep="env-cut", turn=t, obs=(11, 12), gen=(5,), done=t == 1, allowed=(5, 6))
        c.truncated = t == 1
        ep.add(c)
    tb = to_tensors(flatten([ep], 1, 0, 0), 64)
    assert np.asarray(tb.cut_pos).tolist() == [-1]
