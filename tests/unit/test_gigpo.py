"""GiGPO: step groups of turns that act from the same observation within one prompt's episodes, the
episode term plus omega times the step term on each turn's action tokens, its configuration rules, and a
Trainer step (the worked example of docs/estimators.md is checked in test_estimators_doc.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from turnstream.buffer.store.episodes import Episode, flatten
from turnstream.core.config import ConfigError, load_config
from turnstream.core.config_learner import GigpoSection, LearnerSection
from turnstream.learner.estimators.advantages import (discounted_returns, gigpo_advantages, gigpo_step_advantages,
                                           grpo_advantages)
from turnstream.learner.batch.tensors import to_tensors
from tests import estimator_compute as estimators
from turnstream.learner.estimators.episodes import turn_observations
from turnstream.learner.estimators.spo import SpoTracker
from turnstream.learner.step.trainer import Trainer
from turnstream.protocol.messages import Batch, TurnChunk
from tests.learner_batches import synthetic_batch, tiny_causal_lm


def episode(eid: str, prompt: str, turns: list[tuple[list[int], int, float]]) -> Episode:
    """turns: (observation tokens, number of action tokens, reward after the turn)."""
    ep = Episode(eid, ("a", 0), prompt)
    for h, (obs, n_act, reward) in enumerate(turns):
        ep.add(TurnChunk(actor_id="a", epoch=0, seq=h, episode_id=eid, turn=h, prompt_key=prompt,
                         obs_tokens=np.asarray(obs, np.int32), gen_tokens=np.full(n_act, 7, np.int32),
                         gen_logprobs=np.full(n_act, -0.5, np.float32), gen_versions=np.zeros(n_act, np.int32),
                         reward=reward, done=h == len(turns) - 1))
    return ep


def gigpo(batch: Batch, **settings) -> np.ndarray:
    adv = estimators.compute("gigpo", batch, to_tensors(batch, 64), tracker=SpoTracker(), spo_normalize="token",
                             gamma=0.99, lam=0.9, old_values=None, gigpo=GigpoSection(**settings))
    return adv.token_adv.double().numpy()


# ---- the pure functions ---------------------------------------------------------------------------------

def test_discounted_returns_are_the_return_to_go():
    np.testing.assert_allclose(discounted_returns([0.0, 0.5, 1.0], 0.9), [0.45 + 0.81, 0.5 + 0.9, 1.0])
    np.testing.assert_allclose(discounted_returns([0.0, 0.0, 1.0], 1.0), [1.0, 1.0, 1.0])
    assert discounted_returns([], 0.9).size == 0


def test_step_groups_need_the_same_prompt_and_the_same_observation():
    returns = np.array([1.0, 0.0, 0.5, 0.2, 0.7])
    prompts = ["x", "x", "y", "x", "y"]
    observations = ["s", "s", "s", "t", "u"]
    adv = gigpo_step_advantages(returns, prompts, observations)
    # only turns 0 and 1 share prompt and observation; turn 2 shares the observation with another prompt
    np.testing.assert_allclose(adv, [0.5, -0.5, 0.0, 0.0, 0.0])
    std = gigpo_step_advantages(returns, prompts, observations, divide_by_std=True)
    np.testing.assert_allclose(std, [0.7071, -0.7071, 0, 0, 0], atol=1e-4)


def test_a_lone_or_uniform_step_group_gets_zero():
    adv = gigpo_step_advantages([0.3, 0.9, 0.9, 0.9], ["x"] * 4, ["a", "b", "b", "b"], divide_by_std=True)
    assert adv.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_a_state_revisited_in_one_episode_groups_with_itself():
    terms = gigpo_advantages([1.0], ["x"], [np.array([0.0, 0.0, 1.0])], [["s", "s", "t"]], gamma=0.5, omega=1.0)
    np.testing.assert_allclose(terms.step_returns, [0.25, 0.5, 1.0])
    np.testing.assert_allclose(terms.step, [-0.125, 0.125, 0.0])
    np.testing.assert_allclose(terms.episode, 0.0)  # an episode alone with its prompt: 0, as GRPO


def test_total_is_episode_plus_omega_times_step():
    rewards = [np.array([0.0, 1.0]), np.array([0.0, 0.0]), np.array([1.0])]
    observations = [["s0", "s1"], ["s0", "s1"], ["s0"]]
    terms = gigpo_advantages([1.0, 0.0, 1.0], ["x"] * 3, rewards, observations, gamma=0.9, omega=0.5)
    np.testing.assert_allclose(terms.episode, np.repeat([1 / 3, -2 / 3, 1 / 3], [2, 2, 1]))
    np.testing.assert_allclose(terms.step_returns, [0.9, 1.0, 0.0, 0.0, 1.0])
    np.testing.assert_allclose(terms.step, [0.9 - 1.9 / 3, 0.5, -1.9 / 3, -0.5, 1 - 1.9 / 3])
    np.testing.assert_allclose(terms.total, terms.episode + 0.5 * terms.step)


# ---- the estimator on batches ----------------------------------------------------------------------------

def three_episodes() -> Batch:
    """Prompt x twice, meeting observation [9, 9] at turn 1; prompt y meets it too, alone in its prompt."""
    return flatten([
        episode("a", "x", [([1, 2], 2, 0.0), ([9, 9], 1, 1.0)]),
        episode("b", "x", [([1, 3], 1, 0.0), ([9, 9], 3, 0.0)]),
        episode("c", "y", [([1, 2], 1, 0.0), ([9, 9], 2, 1.0)]),
    ], 1, 0, 0)


def test_each_turns_action_tokens_get_its_advantage():
    batch = three_episodes()
    adv = gigpo(batch, gamma=0.5, omega=2.0)
    # x: returns 1 and 0 -> A_E = +-0.5; turn 0 observations differ (singletons); turn 1 shares [9, 9]:
    # R = 1 and 0 -> A_S = +-0.5. y: alone (A_E 0) and its [9, 9] is another prompt's: A_S 0
    expected = [0.5, 0.5, 0.5 + 2 * 0.5, -0.5, -0.5 - 2 * 0.5, -0.5 - 2 * 0.5, -0.5 - 2 * 0.5, 0.0, 0.0, 0.0]
    np.testing.assert_allclose(adv, expected, atol=1e-6)


def test_the_observation_is_the_whole_run_of_tokens_before_the_action():
    batch = three_episodes()
    observed = turn_observations(batch)
    assert observed[(0, 0)] == np.array([1, 2], np.int32).tobytes() == observed[(2, 0)]
    assert observed[(0, 1)] == observed[(1, 1)] != observed[(1, 0)]
    assert len(observed) == 6


def test_without_repeated_observations_it_is_grpo():
    batch = synthetic_batch(12, group=4, seed=3)  # random observations: no two turns share one
    keys = [(batch.prompt_keys[e], obs) for (e, _), obs in turn_observations(batch).items()]
    assert len(set(keys)) == len(keys)
    tb = to_tensors(batch, 64)
    grpo = grpo_advantages(np.asarray(batch.returns), batch.prompt_keys)[tb.act_episode.numpy()]
    np.testing.assert_allclose(gigpo(batch, normalize="std"), grpo, atol=1e-6)
    r = np.asarray(batch.returns)
    centred = r - np.array([r[[i for i, k in enumerate(batch.prompt_keys) if k == key]].mean()
                            for key in batch.prompt_keys])
    np.testing.assert_allclose(gigpo(batch), centred[tb.act_episode.numpy()], atol=1e-6)


def test_a_batch_without_turn_rewards_puts_the_return_on_the_last_turn():
    batch = three_episodes()
    batch.turn_rewards, batch.turn_offsets = np.zeros(0, np.float32), np.zeros(0, np.int64)  # an older buffer
    np.testing.assert_allclose(gigpo(batch, gamma=0.5, omega=2.0), gigpo(three_episodes(), gamma=0.5, omega=2.0))


# ---- configuration and the trainer -----------------------------------------------------------------------

def test_gigpo_needs_group_sampling_with_groups_of_two_or_more():
    for overrides in (["learner.estimator=gigpo"],
                      ["learner.estimator=gigpo", "buffer.sampling=group"],
                      ["learner.estimator=gigpo", "tasks.group_size=4"]):
        with pytest.raises(ConfigError) as info:
            load_config(None, overrides)
        assert str(info.value).startswith("learner.estimator: "), info.value
    cfg = load_config(None, ["learner.estimator=gigpo", "buffer.sampling=group", "tasks.group_size=4",
                             "learner.gigpo.omega=0.5", "learner.gigpo.normalize=std"])
    assert cfg.learner.gigpo == GigpoSection(omega=0.5, normalize="std")
    with pytest.raises(ConfigError, match=r"^learner\.gigpo\.gamma: "):
        load_config(None, ["learner.gigpo.gamma=1.5"])


def test_a_trainer_step_with_gigpo():
    trainer = Trainer(tiny_causal_lm(), LearnerSection(estimator="gigpo", lr=1e-2, device="cpu"))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    stats = trainer.step(synthetic_batch(8, group=4))
    assert trainer.version == 1 and stats["policy_loss"] == stats["policy_loss"]
    assert trainer.net.critic is None  # critic-free
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
