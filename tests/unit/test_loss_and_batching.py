"""learner.loss.decoupled_ppo_loss, learner.batching (to_tensors) and the action log-probs of learner/batch/forward.py's
micro-batches (tests/learner_logprobs.py) with tiny fake models."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.learner_logprobs import action_logprobs
from turnstream.buffer.store.episodes import flatten
from turnstream.buffer.store.replay_store import ReplayStore
from turnstream.learner.batch.tensors import to_tensors
from turnstream.learner.step.loss import decoupled_ppo_loss
from turnstream.protocol.chunk_batch import pack
from turnstream.protocol.codec import decode, encode
from turnstream.protocol.messages import Batch, TurnChunk


def loss_of(logp, prox, behav, adv, clip_low=0.2, clip_high=0.28, weight_cap=2.0):
    return decoupled_ppo_loss(logp, prox, behav, adv, clip_low=clip_low, clip_high=clip_high, weight_cap=weight_cap)


# ---- decoupled PPO ---------------------------------------------------------------------------------

def test_on_policy_loss_is_minus_mean_advantage_with_plain_policy_gradient():
    g = torch.Generator().manual_seed(0)
    base = -torch.rand(7, generator=g) * 3
    adv = torch.randn(7, generator=g)
    logp = base.clone().requires_grad_(True)
    loss, stats = loss_of(logp, base.clone(), base.clone(), adv)
    assert loss.item() == pytest.approx(-adv.mean().item(), abs=1e-6)
    loss.backward()
    torch.testing.assert_close(logp.grad, -adv / 7)  # d/dlogp of -A * exp(logp - prox) at ratio 1
    assert stats["policy_loss"] == pytest.approx(loss.item())
    assert stats["clip_fraction"] == 0.0
    assert stats["approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert stats["is_weight_mean"] == pytest.approx(1.0) and stats["is_weight_max"] == pytest.approx(1.0)
    assert stats["is_weight_truncated_fraction"] == 0.0


def test_behaviour_weight_is_truncated_at_the_cap():
    prox = torch.tensor([-1.0, -1.0, -1.0, -1.0])
    behav = prox - torch.tensor([math.log(5.0), math.log(1.5), 0.0, math.log(2.5)])  # w = 5, 1.5, 1, 2.5
    adv = torch.tensor([1.0, -2.0, 0.5, 1.0])
    logp = prox.clone().requires_grad_(True)
    loss, stats = loss_of(logp, prox, behav, adv, weight_cap=2.0)
    truncated = torch.tensor([2.0, 1.5, 1.0, 2.0])
    assert loss.item() == pytest.approx((-(truncated * adv)).mean().item(), abs=1e-6)
    loss.backward()
    torch.testing.assert_close(logp.grad, -truncated * adv / 4)
    assert stats["is_weight_truncated_fraction"] == pytest.approx(0.5)
    assert stats["is_weight_max"] == pytest.approx(5.0, rel=1e-5)  # reported before truncation
    assert stats["is_weight_mean"] == pytest.approx((5 + 1.5 + 1 + 2.5) / 4, rel=1e-5)


def test_behaviour_weight_carries_no_gradient():
    prox = torch.tensor([-1.0, -2.0])
    behav = torch.tensor([-1.5, -1.0], requires_grad=True)
    logp = prox.clone().requires_grad_(True)
    loss, _ = loss_of(logp, prox, behav, torch.tensor([1.0, -1.0]), weight_cap=10.0)
    loss.backward()
    assert behav.grad is None


@pytest.mark.parametrize("ratio,adv,grad_flows", [
    (1.5, +1.0, False),  # above 1 + clip_high on the advantageous side: clipped
    (0.5, -1.0, False),  # below 1 - clip_low on the advantageous side: clipped
    (1.5, -1.0, True),  # pessimistic side keeps the unclipped term
    (0.5, +1.0, True),
    (1.1, +1.0, True),  # inside the trust region
    (0.9, -1.0, True),
    (1.27, +1.0, True),  # just inside 1 + clip_high = 1.28
    (0.81, -1.0, True),  # just inside 1 - clip_low = 0.8
])
def test_clipping(ratio, adv, grad_flows):
    prox = torch.tensor([-1.2])
    logp = (prox + math.log(ratio)).requires_grad_(True)
    loss, stats = loss_of(logp, prox, prox.clone(), torch.tensor([adv]), clip_low=0.2, clip_high=0.28)
    loss.backward()
    if grad_flows:
        assert logp.grad.item() == pytest.approx(-adv * ratio, rel=1e-5)
        assert loss.item() == pytest.approx(-adv * ratio, rel=1e-5)
    else:
        assert logp.grad.item() == 0.0
        bound = 1.28 if ratio > 1 else 0.8
        assert loss.item() == pytest.approx(-adv * bound, rel=1e-5)
    outside = ratio > 1.28 or ratio < 0.8
    assert stats["clip_fraction"] == (1.0 if outside else 0.0)


# (log mu, log pi_prox, log pi_theta, A) -> w * min(uA, clip(u)A), grad flows?
WORKED_LOSS = {
    "A": (-1.2, -1.0, -0.9, +1.0, 1.3499, True),
    "B": (-2.0, -1.0, -1.05, +1.0, 2.5857, True),
    "C": (-1.0, -1.1, -1.5, -1.0, -0.7239, False),
    "D": (-3.0, -1.2, -1.0, +1.0, 7.2596, False),
}


@pytest.mark.parametrize("case", sorted(WORKED_LOSS))
def test_worked_loss_example(case):
    log_mu, log_prox, log_theta, adv, objective, grad_flows = WORKED_LOSS[case]
    assert math.exp(log_mu) == pytest.approx({"A": 0.3012, "B": 0.1353, "C": 0.3679, "D": 0.0498}[case], abs=1e-4)
    logp = torch.tensor([log_theta], dtype=torch.float64, requires_grad=True)
    loss, _ = decoupled_ppo_loss(logp, torch.tensor([log_prox], dtype=torch.float64),
                                 torch.tensor([log_mu], dtype=torch.float64), torch.tensor([adv], dtype=torch.float64),
                                 clip_low=0.2, clip_high=0.2, weight_cap=100.0)
    assert loss.item() == pytest.approx(-objective, abs=1e-4)
    loss.backward()
    assert (logp.grad.item() != 0.0) is grad_flows


def test_worked_loss_example_with_tis_cap_two():
    log_mu, log_prox, log_theta, adv = -3.0, -1.2, -1.0, 1.0  # case D: w = 6.05 truncated to 2
    loss, stats = decoupled_ppo_loss(torch.tensor([log_theta]), torch.tensor([log_prox]), torch.tensor([log_mu]),
                                     torch.tensor([adv]), clip_low=0.2, clip_high=0.2, weight_cap=2.0)
    assert loss.item() == pytest.approx(-2.0 * 1.2, abs=1e-5)
    assert stats["is_weight_truncated_fraction"] == 1.0


def test_loss_is_a_token_mean():
    prox = torch.zeros(4) - 1
    a = loss_of(prox.clone(), prox, prox, torch.tensor([1.0, 1.0, 1.0, 1.0]))[0]
    b = loss_of(prox[:2].clone(), prox[:2], prox[:2], torch.tensor([1.0, 1.0]))[0]
    assert a.item() == pytest.approx(b.item())


# ---- batching ----------------------------------------------------------------------------------------

V = 12


class BigramModel:
    """logits at position p are a fixed function of the token at p; honours row subsets naturally."""

    def __init__(self, seed: int = 0):
        self.table = torch.randn(V, V, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
        self.calls: list[torch.Tensor] = []  # input_ids of each call

    def __call__(self, input_ids, **_):
        self.calls.append(input_ids)
        return SimpleNamespace(logits=self.table[input_ids])


def make_chunk(seq, ep, turn, obs, gen, logp, done, allowed=(), temperature=1.0, versions=None):
    versions = [0] * len(gen) if versions is None else versions
    return TurnChunk(actor_id="a", epoch=0, seq=seq, episode_id=ep, turn=turn, prompt_key=f"prompt-{ep}",
                     obs_tokens=np.asarray(obs, np.int32), gen_tokens=np.asarray(gen, np.int32),
                     gen_logprobs=np.asarray(logp, np.float32), gen_versions=np.asarray(versions, np.int32),
                     reward=1.0 if done else 0.0, done=done, temperature=temperature,
                     allowed_tokens=np.asarray(allowed, np.int32))


def served_batch() -> Batch:
    """Episode "a": [1 2 | 3 4] [6 | 7]; episode "b": [8 9 10 | 5]; '|' separates observation and action."""
    store = ReplayStore(batch_episodes=2, eta=2, max_staleness=2, max_running=10, max_items=10,
                        episode_timeout_s=60, actor_timeout_s=60)
    chunks = [
        make_chunk(0, "a", 0, (1, 2), (3, 4), (-0.3, -1.1), False, allowed=(3, 4, 5), temperature=0.7, versions=(1, 2)),
        make_chunk(1, "b", 0, (8, 9, 10), (5,), (-0.6,), True, allowed=(5, 6), temperature=1.3, versions=(2,)),
        make_chunk(2, "a", 1, (6,), (7,), (-2.0,), True, temperature=0.7, versions=(2,)),
    ]
    for c in chunks:
        assert store.ingest_message(b"a", pack([c])) == [(c.seq, "ok", "")]
    episodes, dropped = store.take_batch(2, 2)
    return flatten(episodes, request_id=1, learner_version=2, dropped_stale=dropped)


def expected_logp_entropy(model: BigramModel, batch: Batch):
    """Straight from the definition, one action token at a time, in flat order."""
    logps, ents = [], []
    for i in np.nonzero(batch.action_mask)[0]:
        logits = model.table[int(batch.tokens[i - 1])].double() / float(batch.temperature[i])
        mid = int(batch.mask_id[i])
        support = list(range(V)) if mid < 0 else batch.allowed_sets[mid]
        sub = torch.log_softmax(logits[support], dim=-1)
        logps.append(sub[support.index(int(batch.tokens[i]))].item())
        ents.append(-(sub.exp() * sub).sum().item())
    return torch.tensor(logps, dtype=torch.float64), torch.tensor(ents, dtype=torch.float64)


def test_flattened_batch_layout():
    batch = served_batch()
    assert batch.episode_ids == ["b", "a"]
    np.testing.assert_array_equal(batch.tokens, [8, 9, 10, 5, 1, 2, 3, 4, 6, 7])
    np.testing.assert_array_equal(batch.action_mask, [0, 0, 0, 1, 0, 0, 1, 1, 0, 1])


def test_to_tensors():
    batch = served_batch()
    tb = to_tensors(batch, vocab_size=V, pad_id=11)
    assert tb.num_episodes == 2
    torch.testing.assert_close(tb.input_ids, torch.tensor([[8, 9, 10, 5, 11, 11], [1, 2, 3, 4, 6, 7]]))
    torch.testing.assert_close(tb.attention_mask, torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]]))
    # observation tokens are not actions
    torch.testing.assert_close(tb.act_tokens, torch.tensor([5, 3, 4, 7]))
    torch.testing.assert_close(tb.act_episode, torch.tensor([0, 1, 1, 1]))
    torch.testing.assert_close(tb.act_pos, torch.tensor([3, 2, 3, 5]))
    torch.testing.assert_close(tb.behav_logp, torch.tensor([-0.6, -0.3, -1.1, -2.0]))
    torch.testing.assert_close(tb.act_versions, torch.tensor([2, 1, 2, 2]))
    torch.testing.assert_close(tb.temperature, torch.tensor([1.3, 0.7, 0.7, 0.7]))
    assert tb.tokens_per_episode.tolist() == [1, 3]
    assert tb.allowed.shape == (2, V)
    for s, members in enumerate(batch.allowed_sets):
        assert torch.nonzero(tb.allowed[s]).flatten().tolist() == sorted(members)
    assert tb.mask_id.tolist() == [batch.allowed_sets.index([5, 6]), batch.allowed_sets.index([3, 4, 5]),
                                   batch.allowed_sets.index([3, 4, 5]), -1]


def test_to_tensors_after_a_wire_round_trip():
    batch = served_batch()
    a, b = to_tensors(batch, V), to_tensors(decode(encode(batch)), V)
    for name in ("input_ids", "attention_mask", "act_episode", "act_pos", "act_tokens", "behav_logp", "mask_id"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name))


@pytest.mark.parametrize("bad_token", [V, V + 5, -1])
def test_to_tensors_rejects_tokens_outside_the_vocabulary(bad_token):
    batch = served_batch()
    batch.tokens = batch.tokens.copy()
    batch.tokens[1] = bad_token
    with pytest.raises(ValueError):
        to_tensors(batch, vocab_size=V)


def test_to_tensors_accepts_the_largest_token_id():
    batch = served_batch()
    batch.tokens = batch.tokens.copy()
    batch.tokens[0] = V - 1
    assert to_tensors(batch, vocab_size=V).input_ids[0, 0] == V - 1


def test_to_tensors_rejects_an_episode_that_starts_with_an_action():
    batch = served_batch()
    batch.action_mask = batch.action_mask.copy()
    batch.action_mask[4] = 1  # first token of episode "a"
    with pytest.raises(ValueError):
        to_tensors(batch, vocab_size=V)


def test_action_logprobs_match_the_sampling_distribution():
    batch = served_batch()
    model = BigramModel()
    tb = to_tensors(batch, V)
    logp, entropy = action_logprobs(model, tb)
    want_logp, want_ent = expected_logp_entropy(model, batch)
    torch.testing.assert_close(logp.double(), want_logp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy.double(), want_ent, atol=1e-5, rtol=1e-5)
    # restricted tokens: entropy is over the allowed set, so it is at most log |set|
    assert entropy[0].item() <= math.log(2) + 1e-6  # allowed {5, 6}
    assert entropy[1].item() <= math.log(3) + 1e-6  # allowed {3, 4, 5}
    ids, = model.calls  # one row per episode (no context restarts), right-padded
    torch.testing.assert_close(ids, tb.input_ids)


def test_action_logprobs_use_the_temperature():
    batch = served_batch()
    model = BigramModel()
    tb = to_tensors(batch, V)
    hot = to_tensors(batch, V)
    hot.temperature = torch.ones_like(tb.temperature)
    assert not torch.allclose(action_logprobs(model, tb)[0], action_logprobs(model, hot)[0])


def test_unrestricted_logprob_equals_full_vocabulary_log_softmax():
    batch = served_batch()
    model = BigramModel(seed=3)
    logp, entropy = action_logprobs(model, to_tensors(batch, V))
    full = torch.log_softmax(model.table[6] / 0.7, dim=-1)  # last action of "a": token 7 after 6, whole vocabulary
    assert logp[3].item() == pytest.approx(full[7].item(), abs=1e-5)
    assert entropy[3].item() == pytest.approx(-(full.exp() * full).sum().item(), abs=1e-5)


def test_action_logprobs_for_a_row_subset():
    batch = served_batch()
    model = BigramModel(seed=1)
    tb = to_tensors(batch, V)
    full_logp, full_ent = action_logprobs(model, tb)
    for rows in (torch.tensor([1]), torch.tensor([0]), torch.tensor([1, 0])):
        logp, ent = action_logprobs(model, tb, rows)
        select = torch.isin(tb.act_episode, rows)
        torch.testing.assert_close(logp, full_logp[select])
        torch.testing.assert_close(ent, full_ent[select])
        width = int(tb.attention_mask[rows].sum(1).max())  # cut to the rows' longest episode
        torch.testing.assert_close(model.calls[-1], tb.input_ids[rows.sort().values, :width])


def test_disallowed_logits_get_no_gradient():
    batch = served_batch()
    tb = to_tensors(batch, V)
    logits = torch.randn(2, tb.input_ids.shape[1], V, generator=torch.Generator().manual_seed(5), requires_grad=True)
    model = lambda input_ids, **_: SimpleNamespace(logits=logits)  # noqa: E731
    logp, entropy = action_logprobs(model, tb)
    assert torch.isfinite(logp).all() and torch.isfinite(entropy).all()
    (logp.sum() + entropy.sum()).backward()
    # episode 0 ("b"): its action at position 3 is predicted from position 2 and restricted to {5, 6}
    g = logits.grad[0, 2]
    assert torch.count_nonzero(g[[i for i in range(V) if i not in (5, 6)]]) == 0
    assert torch.count_nonzero(g[[5, 6]]) == 2
    # observation positions that predict no action get nothing
    assert torch.count_nonzero(logits.grad[0, [0, 1, 3, 4, 5]]) == 0
    assert torch.count_nonzero(logits.grad[1, [0, 3, 5]]) == 0  # row "a": positions 1, 2, 4 predict actions
