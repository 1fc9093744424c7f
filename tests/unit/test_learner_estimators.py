"""Advantage estimators: turn and token GAE, group baselines, Dr. MAS, and how they read a batch
(the worked examples of docs/estimators.md are checked in test_estimators_doc.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from turnstream.learner.estimators.advantages import agentwise_normalize, gae, grpo_advantages, rloo_advantages, whiten
from turnstream.learner.batch.tensors import to_tensors
from tests import estimator_compute as estimators
from turnstream.learner.estimators.episodes import episode_agent_ids, token_agent_ids
from turnstream.learner.estimators.spo import SpoTracker
from tests.learner_batches import init_from_counts, synthetic_batch

# ---- turn-level GAE ---------------------------------------------------------------------------------

V27 = [0.50, 0.60, 0.80]
R27 = [0.0, 0.0, 1.0]


def test_turn_gae_worked_example_gamma_099_lambda_09():
    adv, ret = gae(R27, V27, gamma=0.99, lam=0.9)
    np.testing.assert_allclose(adv, [0.4239, 0.3702, 0.2000], atol=1e-4)  # table rounds 0.42385 up
    np.testing.assert_allclose(ret, [0.9239, 0.9702, 1.0000], atol=1e-4)
    # the deltas of the table
    deltas = [R27[h] + 0.99 * (V27[h + 1] if h < 2 else 0.0) - V27[h] for h in range(3)]
    np.testing.assert_allclose(deltas, [0.0940, 0.1920, 0.2000], atol=5e-5)


def test_turn_gae_worked_example_gamma_lambda_one_is_return_minus_value():
    adv, _ = gae(R27, V27, gamma=1.0, lam=1.0)
    np.testing.assert_allclose(adv, [0.50, 0.40, 0.20], atol=1e-12)


def test_unfinished_episode_bootstraps_from_the_critic():
    adv, ret = gae([0.0, 0.0], [0.5, 0.6], gamma=1.0, lam=1.0, bootstrap=0.7)
    np.testing.assert_allclose(adv, [0.2, 0.1], atol=1e-12)  # the return is V(s_after) = 0.7
    np.testing.assert_allclose(ret, [0.7, 0.7], atol=1e-12)


def test_turn_gae_broadcasts_the_turn_advantage_to_its_action_tokens():
    """Three turns with 2, 1 and 3 action tokens; the critic values at the turn boundaries are V27."""
    gen_lens = [2, 1, 3]
    from turnstream.buffer.store.episodes import Episode, flatten
    from turnstream.protocol.messages import TurnChunk
    ep = Episode("e", ("a", 0), "p")
    for t, n in enumerate(gen_lens):
        ep.add(TurnChunk(actor_id="a", epoch=0, seq=t, episode_id="e", turn=t, prompt_key="p",
                         obs_tokens=np.array([1, 2], np.int32), gen_tokens=np.full(n, 5, np.int32),
                         gen_logprobs=np.full(n, -0.7, np.float32), gen_versions=np.zeros(n, np.int32),
                         reward=1.0 if t == 2 else 0.0, done=t == 2))
    batch = flatten([ep], 1, 0, 0)
    tb = to_tensors(batch, 64)
    # the critic's values at each action token's position; only the boundaries (first token of a turn) count
    old_values = torch.tensor([0.50, 9.0, 0.60, 0.80, 9.0, 9.0])
    adv = estimators.compute("turn_gae", batch, tb, tracker=SpoTracker(), spo_normalize="token", gamma=0.99,
                             lam=0.9, old_values=old_values)
    raw = np.repeat([0.4239, 0.3702, 0.2000], gen_lens)
    np.testing.assert_allclose(adv.token_adv.numpy(), whiten(raw), atol=2e-3)
    assert adv.value_mask.tolist() == [True, False, True, True, False, False]
    np.testing.assert_allclose(adv.value_targets[adv.value_mask].numpy(), [0.9239, 0.9702, 1.0], atol=1e-4)


def test_token_gae_skips_observation_tokens():
    """Token-level GAE runs over action tokens only: the next value is the next *action* token's."""
    from turnstream.buffer.store.episodes import Episode, flatten
    from turnstream.protocol.messages import TurnChunk
    ep = Episode("e", ("a", 0), "p")
    for t in range(2):
        ep.add(TurnChunk(actor_id="a", epoch=0, seq=t, episode_id="e", turn=t, prompt_key="p",
                         obs_tokens=np.array([1, 2, 3], np.int32), gen_tokens=np.array([5, 6], np.int32),
                         gen_logprobs=np.full(2, -0.7, np.float32), gen_versions=np.zeros(2, np.int32),
                         reward=1.0 if t == 1 else 0.0, done=t == 1))
    batch = flatten([ep], 1, 0, 0)
    tb = to_tensors(batch, 64)
    values = torch.tensor([0.2, 0.4, 0.5, 0.9])
    adv = estimators.compute("token_gae", batch, tb, tracker=SpoTracker(), spo_normalize="token", gamma=0.9,
                             lam=0.8, old_values=values)
    raw, ret = gae([0, 0, 0, 1.0], values.numpy(), 0.9, 0.8)
    np.testing.assert_allclose(adv.token_adv.numpy(), whiten(raw), atol=1e-5)
    np.testing.assert_allclose(adv.value_targets.numpy(), ret, atol=1e-6)
    assert adv.value_mask.all()


# ---- group baselines ---------------------------------------------------------------------------------

def test_grpo_is_group_standardised():
    r = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.5])
    keys = ["a", "a", "a", "a", "b", "b", "b", "b"]
    adv = grpo_advantages(r, keys)
    for g in ("a", "b"):
        sel = np.array(keys) == g
        want = (r[sel] - r[sel].mean()) / (r[sel].std(ddof=1) + 1e-6)
        np.testing.assert_allclose(adv[sel], want, atol=1e-12)
    np.testing.assert_allclose(adv[:4], [0.8660, -0.8660, -0.8660, 0.8660], atol=1e-4)


def test_rloo_is_leave_one_out_and_equals_scaled_centring():
    r = np.array([1.0, 0.0, 0.0, 1.0, 0.25, 0.75])
    keys = ["a"] * 4 + ["b"] * 2
    adv = rloo_advantages(r, keys)
    np.testing.assert_allclose(adv[:4], [1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3], atol=1e-12)
    g = 4
    np.testing.assert_allclose(adv[:4], g / (g - 1) * (r[:4] - r[:4].mean()), atol=1e-12)
    np.testing.assert_allclose(adv[4:], [-0.5, 0.5], atol=1e-12)


@pytest.mark.parametrize("fn", [grpo_advantages, rloo_advantages])
def test_singletons_and_degenerate_groups_carry_no_signal(fn):
    adv = fn(np.array([1.0, 0.0, 1.0, 1.0]), ["x", "y", "z", "z"])
    np.testing.assert_allclose(adv, 0.0, atol=1e-9)


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_group_estimators_broadcast_to_every_action_token(name):
    batch = synthetic_batch(8, group=4, seed=3)
    tb = to_tensors(batch, 64)
    adv = estimators.compute(name, batch, tb, tracker=SpoTracker(), spo_normalize="token", gamma=1, lam=1,
                             old_values=None)
    fn = grpo_advantages if name == "grpo" else rloo_advantages
    per_episode = fn(np.array(batch.returns), batch.prompt_keys)
    np.testing.assert_allclose(adv.token_adv.numpy(), per_episode[tb.act_episode.numpy()], atol=1e-6)


def test_spo_estimator_reads_the_tracker_before_the_update():
    batch = synthetic_batch(4, seed=5)
    tb = to_tensors(batch, 64)
    t = SpoTracker()
    init_from_counts(t, "p0", 7, 8)
    before = dict(t.state)
    adv = estimators.compute("spo", batch, tb, tracker=t, spo_normalize="sequence", gamma=1, lam=1, old_values=None)
    assert t.state == before
    from turnstream.learner.estimators.spo import normalize_advantages
    raw = np.array(batch.returns) - np.array([t.value(k) for k in batch.prompt_keys])
    want = normalize_advantages(raw, tb.tokens_per_episode, "sequence")[tb.act_episode.numpy()]
    np.testing.assert_allclose(adv.token_adv.numpy(), want, atol=1e-6)


def test_unknown_estimator_is_rejected():
    batch = synthetic_batch(2)
    with pytest.raises(ValueError):
        estimators.compute("vtrace", batch, to_tensors(batch, 64), tracker=SpoTracker(), spo_normalize="token",
                           gamma=1, lam=1, old_values=None)


# ---- Dr. MAS agent-wise normalisation ----------------------------------------------------------------

def test_agentwise_normalisation_uses_each_agents_own_statistics():
    adv = np.array([10.0, 20.0, 30.0, 0.1, 0.2, 0.3])
    agents = np.array([0, 0, 0, 1, 1, 1])
    out = agentwise_normalize(adv, agents)
    np.testing.assert_allclose(out[:3], out[3:], atol=1e-6)  # same shape of spread, different scales
    for a in (0, 1):
        assert out[agents == a].mean() == pytest.approx(0.0, abs=1e-9)
        assert out[agents == a].std() == pytest.approx(1.0, abs=1e-6)
    glob = whiten(adv)
    assert np.ptp(glob[3:]) < 0.05 < 2.0 < np.ptp(out[3:])  # a global baseline flattens the small-scale agent


def test_agent_ids_come_from_the_batch():
    batch = synthetic_batch(4, seed=2)
    assert batch.agent_ids.tolist() == [0, 0, 0, 0]
    assert episode_agent_ids(batch) is None  # one agent: nothing to normalise apart
    batch.agent_ids = np.array([0, 1, 0, 1], np.int32)
    assert episode_agent_ids(batch).tolist() == [0, 1, 0, 1]


def _three_turns(rewards, *, truncated=False):
    from turnstream.buffer.store.episodes import Episode, flatten
    from turnstream.protocol.messages import TurnChunk
    ep = Episode("e", ("a", 0), "p")
    for t, r in enumerate(rewards):
        ep.add(TurnChunk(actor_id="a", epoch=0, seq=t, episode_id="e", turn=t, prompt_key="p",
                         obs_tokens=np.array([1, 2], np.int32), gen_tokens=np.full(1, 5, np.int32),
                         gen_logprobs=np.full(1, -0.7, np.float32), gen_versions=np.zeros(1, np.int32),
                         reward=r, done=t == len(rewards) - 1, truncated=truncated and t == len(rewards) - 1))
    batch = flatten([ep], 1, 0, 0)
    return batch, to_tensors(batch, 64)


def _raw_turn_gae(batch, tb, values, gamma=1.0, lam=1.0):
    # the critic targets are the raw GAE returns per turn (the advantages come out whitened)
    adv = estimators.compute("turn_gae", batch, tb, tracker=SpoTracker(), spo_normalize="token", gamma=gamma,
                             lam=lam, old_values=torch.tensor(values))
    return adv.value_targets.numpy()


def test_the_buffer_sends_each_turns_reward_and_turn_gae_credits_it_to_that_turn():
    batch, tb = _three_turns([0.5, 0.0, 1.0])
    assert batch.turn_rewards.tolist() == [0.5, 0.0, 1.0] and batch.turn_offsets.tolist() == [0, 3]
    assert batch.returns == [1.5]
    targets = _raw_turn_gae(batch, tb, [0.0, 0.0, 0.0])
    # gamma = lambda = 1: each turn's target is the reward from that turn on, not the whole return at the end
    np.testing.assert_allclose(targets, [1.5, 1.0, 1.0])
    batch.turn_rewards, batch.turn_offsets = np.zeros(0, np.float32), np.zeros(0, np.int64)  # an older buffer
    np.testing.assert_allclose(_raw_turn_gae(batch, tb, [0.0, 0.0, 0.0]), [1.5, 1.5, 1.5])


def test_a_truncated_episode_bootstraps_from_the_critic_instead_of_zero():
    batch, tb = _three_turns([0.0, 0.0, 0.0], truncated=True)
    assert batch.truncated.tolist() == [True]
    np.testing.assert_allclose(_raw_turn_gae(batch, tb, [0.2, 0.4, 0.8]), [0.8, 0.8, 0.8])
    batch, tb = _three_turns([0.0, 0.0, 0.0])
    np.testing.assert_allclose(_raw_turn_gae(batch, tb, [0.2, 0.4, 0.8]), [0.0, 0.0, 0.0])


def test_trainer_normalises_per_agent_when_asked():
    from turnstream.learner.step.trainer import Trainer
    from tests.learner_batches import tiny_causal_lm
    from turnstream.core.config import LearnerSection

    batch = synthetic_batch(8, seed=6, group=2)
    batch.agent_ids = np.array([i % 2 for i in range(8)], np.int32)
    batch.returns = [1.0, -5.0, 0.0, 5.0, 1.0, -5.0, 0.0, 5.0]  # agent 1 plays for much larger stakes
    tb = to_tensors(batch, 64)
    ids = token_agent_ids(batch, tb)
    assert ids.tolist() == [int(batch.agent_ids[e]) for e in tb.act_episode.tolist()]
    trainer = Trainer(tiny_causal_lm(), LearnerSection(estimator="rloo", agent_norm=True))
    assert trainer.step(batch)["version"] == 1
