"""Objectives: TIS vs IcePop masking, aggregation modes, k3 KL, value clip, turn ratio (docs/estimators.md)."""
from __future__ import annotations

import math

import pytest
import torch

from turnstream.learner.step.loss import (aggregation_weights, behaviour_weights, decoupled_ppo_loss, explained_variance,
                          group_log_ratio, kl_k3, value_loss)

# the loss's worked example: (log mu, log pi_prox, log pi_theta, A, objective, w, TIS w (C=2), masked in [0.2, 5]?)
CASES = {
    "A": (-1.2, -1.0, -0.9, +1.0, 1.3499, 1.2214, 1.2214, False),
    "B": (-2.0, -1.0, -1.05, +1.0, 2.5857, 2.7183, 2.0, False),
    "C": (-1.0, -1.1, -1.5, -1.0, -0.7239, 0.9048, 0.9048, False),
    "D": (-3.0, -1.2, -1.0, +1.0, 7.2596, 6.0496, 2.0, True),
}
ORDER = sorted(CASES)


def column(i):
    return torch.tensor([CASES[c][i] for c in ORDER], dtype=torch.float64)


def test_worked_example_behaviour_weight_columns():
    mu, prox = column(0), column(1)
    w, _ = behaviour_weights(prox, mu, mode="none")
    assert w.tolist() == [1.0] * 4
    raw = torch.exp(prox - mu)
    torch.testing.assert_close(raw, column(5), atol=1e-4, rtol=0)
    tis, stats = behaviour_weights(prox, mu, mode="truncate", cap=2.0)
    torch.testing.assert_close(tis, column(6), atol=1e-4, rtol=0)
    assert stats["is_weight_truncated_fraction"] == 0.5
    masked, stats = behaviour_weights(prox, mu, mode="mask_token", low=0.2, high=5.0)
    keep = ~column(7).bool()
    torch.testing.assert_close(masked, raw * keep)  # IcePop keeps the in-band ratio itself
    assert stats["is_weight_masked_fraction"] == 0.25
    assert stats["is_weight_max"] == pytest.approx(6.0496, abs=1e-4)


def test_worked_example_masked_objective():
    mu, prox, theta, adv = column(0), column(1), column(2).requires_grad_(True), column(3)
    loss, _ = decoupled_ppo_loss(theta, prox, mu, adv, clip_low=0.2, clip_high=0.2, weight_cap=2, mode="mask_token",
                                 mask_low=0.2, mask_high=5.0, token_weights=torch.ones(4, dtype=torch.float64))
    # case D is masked out; the others keep the objective of the table
    assert loss.item() == pytest.approx(-(1.3499 + 2.5857 - 0.7239), abs=1e-3)


def test_sequence_mask_uses_the_geometric_mean():
    prox = torch.zeros(5)
    # sequence 0: weights 4 and 0.25 -> geometric mean 1 (kept); sequence 1: 3, 3, 3 -> 3 (masked at high=2)
    behav = -torch.log(torch.tensor([4.0, 0.25, 3.0, 3.0, 3.0]))
    seq = torch.tensor([0, 0, 1, 1, 1])
    w, stats = behaviour_weights(prox, behav, mode="mask_sequence", low=0.5, high=2.0, seq_index=seq)
    torch.testing.assert_close(w, torch.tensor([4.0, 0.25, 0.0, 0.0, 0.0]))
    assert stats["is_weight_masked_fraction"] == pytest.approx(0.6)


def test_masked_tokens_stay_in_the_denominator():
    prox = torch.zeros(4)
    behav = torch.tensor([0.0, 0.0, 0.0, -3.0])  # last token w = e^3 > 5
    adv = torch.ones(4)
    loss, _ = decoupled_ppo_loss(prox.clone(), prox, behav, adv, clip_low=0.2, clip_high=0.2, weight_cap=2,
                                 mode="mask_token")
    assert loss.item() == pytest.approx(-3 / 4)


# ---- aggregation ---------------------------------------------------------------------------------------

EP = torch.tensor([0, 0, 0, 1, 2, 2])  # 3 sequences with 3, 1 and 2 action tokens
L = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])


@pytest.mark.parametrize("mode,expected", [
    ("token-mean", (1 + 2 + 3 + 4 + 5 + 6) / 6),
    ("seq-mean-token-sum", ((1 + 2 + 3) + 4 + (5 + 6)) / 3),
    ("seq-mean-token-mean", ((1 + 2 + 3) / 3 + 4 + (5 + 6) / 2) / 3),
])
def test_aggregation_modes(mode, expected):
    w = aggregation_weights(EP, 3, mode)
    assert float((w * L).sum()) == pytest.approx(expected)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_aggregation_is_invariant_to_splitting_into_micro_batches(mode):
    w = aggregation_weights(EP, 3, mode)
    whole = float((w * L).sum())
    parts = float((w[:3] * L[:3]).sum() + (w[3:] * L[3:]).sum())  # global weights, summed per micro-batch
    assert parts == pytest.approx(whole)


def test_unknown_aggregation_is_rejected():
    with pytest.raises(ValueError):
        aggregation_weights(EP, 3, "sum")


# ---- KL to the reference ------------------------------------------------------------------------------

def test_k3_matches_its_formula_and_is_nonnegative():
    logp = torch.tensor([-1.0, -0.5, -2.0, -0.7])
    ref = torch.tensor([-1.2, -0.5, -1.0, -3.0])
    ell = logp - ref
    torch.testing.assert_close(kl_k3(logp, ref), torch.exp(-ell) - 1 + ell)
    assert (kl_k3(logp, ref) >= 0).all()
    assert kl_k3(ref, ref).abs().max() == 0


def test_k3_is_an_unbiased_kl_estimate():
    """Sampling y ~ pi_theta, the mean of k3 approaches KL(pi_theta || pi_ref)."""
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.tensor([0.3, -0.2, 1.0]), 0)
    q = torch.softmax(torch.tensor([0.0, 0.5, 0.2]), 0)
    y = torch.multinomial(p, 200_000, replacement=True, generator=g)
    est = kl_k3(p.log()[y], q.log()[y]).mean().item()
    exact = float((p * (p.log() - q.log())).sum())
    assert est == pytest.approx(exact, rel=0.03)


# ---- value loss ----------------------------------------------------------------------------------------

def test_value_clip_worked_example():
    v_new = torch.tensor([0.9], requires_grad=True)
    loss, stats = value_loss(v_new, torch.tensor([0.5]), torch.tensor([0.93]), clip=0.2)
    assert loss.item() == pytest.approx(0.02645, abs=1e-6)  # max(0.5*0.03^2, 0.5*0.23^2)
    loss.backward()
    assert v_new.grad.item() == 0.0  # the clipped branch wins and carries no gradient
    assert stats["value_clip_fraction"] == 1.0


def test_value_loss_without_clip_is_half_mse():
    v = torch.tensor([0.9, 0.1])
    loss, _ = value_loss(v, torch.zeros(2), torch.tensor([1.0, 0.0]), clip=0.0)
    assert loss.item() == pytest.approx(0.5 * (0.01 + 0.01) / 2)


def test_explained_variance():
    g = torch.tensor([0.0, 1.0, 0.0, 1.0])
    assert explained_variance(g.clone(), g) == pytest.approx(1.0, abs=1e-4)
    assert explained_variance(torch.full((4,), 0.5), g) == pytest.approx(0.0, abs=1e-4)


# ---- turn-level ratio (MPO / ST-PPO) -------------------------------------------------------------------

def test_turn_ratio_is_the_geometric_mean_of_the_turn():
    log_ratio = torch.tensor([0.1, 0.3, -0.2, 0.05], requires_grad=True)
    group = torch.tensor([0, 0, 1, 1])
    out = group_log_ratio(log_ratio, group)
    torch.testing.assert_close(out, torch.tensor([0.2, 0.2, -0.075, -0.075]))
    out.sum().backward()
    torch.testing.assert_close(log_ratio.grad, torch.ones(4))


def test_turn_ratio_clips_the_whole_turn():
    prox = torch.zeros(2)
    logp = torch.tensor([math.log(1.5), math.log(1.0)], requires_grad=True)  # turn ratio sqrt(1.5) = 1.22
    loss, stats = decoupled_ppo_loss(logp, prox, prox, torch.ones(2), clip_low=0.2, clip_high=0.2, weight_cap=2,
                                     ratio_group=torch.tensor([0, 0]))
    assert loss.item() == pytest.approx(-1.2, abs=1e-6)
    loss.backward()
    assert logp.grad.abs().max() == 0.0  # both tokens clipped together
    assert stats["clip_fraction"] == 1.0
