"""learner.spo: the tracker's worked example of docs/estimators.md ("SPO"), and SPO++'s token measure."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.learner_batches import init_from_counts
from turnstream.learner.estimators.spo import SpoTracker, normalize_advantages

PROMPTS = ["p1", "p2", "p3", "p4"]
COUNTS = {"p1": (2, 8), "p2": (7, 8), "p3": (0, 8), "p4": (0, 0)}
# initial state from offline counts: alpha0, beta0, v0
INIT = {"p1": (2.2222, 5.7778, 0.2778), "p2": (6.6667, 1.3333, 0.8333), "p3": (0.4444, 7.5556, 0.0556),
        "p4": (0.5, 0.5, 0.5000)}
REWARDS = [1.0, 1.0, 0.0, 1.0]
DRIFTS = [0.03, 0.005, 0.0, 0.2]
# one update each: 2^(-D/0.06), rho clipped, alpha', beta', v', N_eff'
UPDATED = {
    "p1": (0.7071, 0.8750, 2.9444, 5.0556, 0.3681, 8.000),
    "p2": (0.9439, 0.9439, 7.2925, 1.2585, 0.8528, 8.551),
    "p3": (1.0000, 0.9600, 0.4267, 8.2533, 0.0492, 8.680),
    "p4": (0.0992, 0.8750, 1.4375, 0.4375, 0.7667, 1.875),
}


def close4(actual, expected):
    assert actual == pytest.approx(expected, abs=5e-5)


@pytest.fixture
def tracker() -> SpoTracker:
    t = SpoTracker()
    for key, (s, n) in COUNTS.items():
        init_from_counts(t, key, s, n)
    return t


def test_defaults_are_the_configs():
    from turnstream.core.config import SpoSection
    t, cfg = SpoTracker(), SpoSection()
    assert (t.rho_min, t.rho_max, t.d_half) == (cfg.rho_min, cfg.rho_max, cfg.d_half) == (0.875, 0.96, 0.06)


@pytest.mark.parametrize("key", PROMPTS)
def test_init_from_counts_matches_table(tracker, key):
    alpha0, beta0, v0 = INIT[key]
    a, b = tracker.state[key]
    close4(a, alpha0)
    close4(b, beta0)
    close4(tracker.value(key), v0)


def test_init_pseudo_count_is_n_init():
    t = SpoTracker()
    init_from_counts(t, "x", 3, 8)
    assert sum(t.state["x"]) == pytest.approx(1 / (1 - 0.875))  # N_eff0 = N_init = 8
    init_from_counts(t, "y", 0, 0)
    assert t.state["y"] == (0.5, 0.5)  # Jeffreys prior


def test_unseen_prompt_reads_jeffreys_prior():
    assert SpoTracker().value("never-seen") == 0.5


def test_raw_advantages(tracker):
    raw = np.array(REWARDS) - np.array([tracker.value(k) for k in PROMPTS])
    np.testing.assert_allclose(raw, [0.7222, 0.1667, -0.0556, 0.5000], atol=5e-5)
    close4(raw.mean(), 0.3333)
    close4(raw.std(ddof=1), 0.3455)


def test_sequence_normalisation_matches_table(tracker):
    raw = np.array(REWARDS) - np.array([tracker.value(k) for k in PROMPTS])
    adv = normalize_advantages(raw, np.array([5, 1, 9, 3]), measure="sequence")
    np.testing.assert_allclose(adv, [1.1257, -0.4825, -1.1257, 0.4825], atol=5e-5)


def test_sequence_normalisation_ignores_token_counts(tracker):
    raw = np.array(REWARDS) - np.array([tracker.value(k) for k in PROMPTS])
    a = normalize_advantages(raw, np.array([1, 1, 1, 1]), measure="sequence")
    b = normalize_advantages(raw, np.array([100, 1, 7, 3]), measure="sequence")
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("i,key", list(enumerate(PROMPTS)))
def test_tracker_update_matches_table(tracker, i, key):
    raw_rho, rho, alpha1, beta1, v1, n_eff1 = UPDATED[key]
    close4(2.0 ** (-DRIFTS[i] / 0.06), raw_rho)
    close4(tracker.rho(DRIFTS[i]), rho)
    returned = tracker.update(key, REWARDS[i], DRIFTS[i])
    close4(returned, rho)
    a, b = tracker.state[key]
    close4(a, alpha1)
    close4(b, beta1)
    close4(tracker.value(key), v1)
    assert a + b == pytest.approx(n_eff1, abs=5e-4)


def test_effective_learning_rate_column(tracker):
    """Equivalent EMA form: v' = v + eta (r - v), eta = 1/(rho N_eff + 1): the effective learning rate."""
    expected_lr = {"p1": 0.1250, "p2": 0.1169, "p3": 0.1152, "p4": 0.5333}
    for i, key in enumerate(PROMPTS):
        v0, n0 = tracker.value(key), sum(tracker.state[key])
        rho = tracker.update(key, REWARDS[i], DRIFTS[i])
        eta = 1 / (rho * n0 + 1)
        close4(eta, expected_lr[key])
        assert tracker.value(key) == pytest.approx(v0 + eta * (REWARDS[i] - v0), abs=1e-12)


def test_rho_is_clipped_to_bounds():
    t = SpoTracker(rho_min=0.5, rho_max=0.9, d_half=1.0)
    assert t.rho(0.0) == 0.9
    assert t.rho(10.0) == 0.5
    assert t.rho(0.5) == pytest.approx(2 ** -0.5)


@pytest.mark.parametrize("reward,clipped", [(2.5, 1.0), (1.0000001, 1.0), (-3.0, 0.0), (-1e-9, 0.0)])
def test_rewards_outside_unit_interval_are_clipped(reward, clipped):
    t = SpoTracker()
    init_from_counts(t, "x", 2, 8)
    a0, b0 = t.state["x"]
    rho = t.update("x", reward, 0.0)
    a, b = t.state["x"]
    assert a == pytest.approx(rho * a0 + clipped, abs=1e-12)
    assert b == pytest.approx(rho * b0 + (1 - clipped), abs=1e-12)
    assert a >= 0 and b >= 0 and 0.0 <= t.value("x") <= 1.0


def test_fractional_reward_is_pseudo_count():
    t = SpoTracker()
    rho = t.update("x", 0.25, 0.0)
    assert t.state["x"] == pytest.approx((rho * 0.5 + 0.25, rho * 0.5 + 0.75))


def test_update_of_unseen_prompt_starts_from_jeffreys():
    t = SpoTracker()
    rho = t.update("new", 1.0, 0.0)
    assert rho == 0.96
    assert t.state["new"] == pytest.approx((0.96 * 0.5 + 1.0, 0.96 * 0.5))


# ---- SPO++ token measure --------------------------------------------------------------------------

RAW = np.array([0.7, -0.2, 0.1, 0.55, -0.6])
TOKENS = np.array([3, 40, 7, 1, 12])


def test_token_measure_weighted_mean_zero_and_std_one():
    adv = normalize_advantages(RAW, TOKENS, measure="token")
    w = TOKENS / TOKENS.sum()
    mean = float((w * adv).sum())
    std = math.sqrt(float((w * (adv - mean) ** 2).sum()))
    assert mean == pytest.approx(0.0, abs=1e-12)
    assert std == pytest.approx(1.0, abs=1e-6)


def test_token_measure_matches_formula():
    mu = (TOKENS * RAW).sum() / TOKENS.sum()
    sigma = math.sqrt((TOKENS * (RAW - mu) ** 2).sum() / TOKENS.sum())
    np.testing.assert_allclose(normalize_advantages(RAW, TOKENS, measure="token"), (RAW - mu) / (sigma + 1e-8),
                               rtol=1e-12)


def test_token_measure_differs_from_sequence_when_lengths_differ():
    tok = normalize_advantages(RAW, TOKENS, measure="token")
    seq = normalize_advantages(RAW, TOKENS, measure="sequence")
    assert not np.allclose(tok, seq, atol=1e-3)
    # the sequence measure leaves a length-correlated push under token-mean aggregation
    assert abs(float((TOKENS * seq).sum() / TOKENS.sum())) > 1e-2


def test_token_measure_with_equal_lengths_is_sequence_up_to_ddof():
    """Equal token counts: same centring; the scale differs only by the population/unbiased std factor."""
    n = RAW.size
    tok = normalize_advantages(RAW, np.full(n, 6), measure="token")
    seq = normalize_advantages(RAW, np.full(n, 6), measure="sequence")
    np.testing.assert_allclose(tok * math.sqrt((n - 1) / n), seq, rtol=1e-6)


def test_token_measure_is_scale_invariant_in_counts():
    a = normalize_advantages(RAW, TOKENS, measure="token")
    b = normalize_advantages(RAW, TOKENS * 7, measure="token")
    np.testing.assert_allclose(a, b, rtol=1e-12)


@pytest.mark.parametrize("measure", ["token", "sequence"])
def test_degenerate_batches_give_zero_advantage(measure):
    assert normalize_advantages(np.array([0.3]), np.array([4]), measure).tolist() == [0.0]
    assert normalize_advantages(np.zeros(0), np.zeros(0), measure).size == 0
    out = normalize_advantages(np.array([0.4, 0.4, 0.4]), np.array([1, 2, 3]), measure)
    np.testing.assert_allclose(out, 0.0, atol=1e-6)


def test_token_measure_with_no_action_tokens_gives_zero():
    np.testing.assert_array_equal(normalize_advantages(RAW, np.zeros(RAW.size), "token"), np.zeros(RAW.size))


# ---- checkpointing ------------------------------------------------------------------------------------

def test_state_dict_round_trip(tracker):
    for i, key in enumerate(PROMPTS):
        tracker.update(key, REWARDS[i], DRIFTS[i])
    saved = json.loads(json.dumps(tracker.state_dict()))  # checkpoints must survive plain JSON
    restored = SpoTracker(rho_min=0.1, rho_max=0.2, d_half=9.0)
    restored.load_state_dict(saved)
    assert restored.state_dict()["config"] == tracker.state_dict()["config"]
    assert restored.state == tracker.state
    for key in PROMPTS + ["unseen"]:
        assert restored.value(key) == tracker.value(key)
    # both continue identically
    assert restored.update("p1", 1.0, 0.04) == tracker.update("p1", 1.0, 0.04)
    assert restored.state["p1"] == tracker.state["p1"]


def test_state_dict_keeps_custom_config():
    t = SpoTracker(rho_min=0.8, rho_max=0.99, d_half=0.1)
    t.update("k", 1.0, 0.0)
    r = SpoTracker()
    r.load_state_dict(t.state_dict())
    assert (r.rho_min, r.rho_max, r.d_half) == (0.8, 0.99, 0.1)
    assert r.rho(0.0) == 0.99
