"""Trainer: every estimator steps, packing does not change the update, checkpoints resume exactly."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from turnstream.learner.step.packing import microbatches, shard
from turnstream.learner.estimators.spo import Spo, SpoTracker, fold_batch
from turnstream.learner.step.trainer import Trainer
from tests.learner_batches import params_after_steps, synthetic_batch, tiny_causal_lm
from turnstream.core.config import LearnerSection
from turnstream.learner.checkpoint import store
from turnstream.learner.checkpoint.layout import latest
from turnstream.learner.checkpoint.trainer_state import file_state, load_file_state


def cfg_for(estimator="spo", **kw) -> LearnerSection:
    # fp32 on the CPU, also on a GPU machine: these tolerances are for exact arithmetic (tests/gpu for CUDA)
    return LearnerSection(estimator=estimator, lr=1e-2, device="cpu", **kw)


@pytest.mark.parametrize("estimator,critic", [("spo", "shared"), ("grpo", "shared"), ("rloo", "shared"),
                                              ("turn_gae", "shared"), ("turn_gae", "separate"),
                                              ("token_gae", "shared"), ("mars", "shared"),
                                              ("turn_td", "shared")])
def test_each_estimator_takes_a_step(estimator, critic, tmp_path):
    cfg = cfg_for(estimator, kl_coef=0.05, entropy_coef=0.01)
    cfg.critic.mode = critic
    model = tiny_causal_lm()
    model.save_pretrained(tmp_path / "critic")
    trainer = Trainer(model, cfg, critic_path=str(tmp_path / "critic"), ref_model=copy.deepcopy(model))
    before = [p.detach().clone() for p in model.parameters()]
    stats = trainer.step(synthetic_batch(8, group=4))
    assert trainer.version == 1 and stats["version"] == 1
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    for key in ("policy_loss", "approx_kl", "clip_fraction", "entropy", "is_weight_mean", "is_weight_max",
                "is_weight_masked_fraction", "grad_norm", "tokens_per_s", "step_s", "ref_kl"):
        assert key in stats and stats[key] == stats[key], key  # present and not NaN
    if estimator.endswith("gae"):
        assert "value_loss" in stats and "explained_variance" in stats
    json.dumps(stats)  # the JSONL log must take it


def test_packing_groups_by_token_budget():
    lengths = [10, 3, 7, 7, 2, 12]
    groups = microbatches(lengths, torch.arange(6), budget=16)  # padded: rows x longest
    for g in groups:
        assert len(g) == 1 or len(g) * max(lengths[i] for i in g) <= 16
    assert sorted(torch.cat(groups).tolist()) == list(range(6))
    packed = microbatches(lengths, torch.arange(6), budget=16, packed=True)  # packed: sum of lengths
    assert all(sum(lengths[i] for i in g) <= 16 for g in packed)
    assert sorted(torch.cat(packed).tolist()) == list(range(6))
    assert len(packed) == 3 < len(groups)  # 41 tokens in 3 rows of 16: no padding
    assert len(microbatches(lengths, torch.arange(6), budget=0)) == 1
    assert [g.tolist() for g in shard([torch.tensor([0]), torch.tensor([1]), torch.tensor([2])], 1, 2)] == [[1]]


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_micro_batching_gives_the_same_update(agg):
    whole = params_after_steps(cfg_for("grpo", loss_agg=agg))
    packed = params_after_steps(cfg_for("grpo", loss_agg=agg, max_tokens_per_microbatch=40))
    assert (whole - packed).abs().max().item() < 1e-5


def test_checkpoint_round_trip_continues_identically(tmp_path):
    src = tmp_path / "src-model"
    tiny_causal_lm().save_pretrained(src)
    (src / "tokenizer_config.json").write_text("{}")
    cfg = cfg_for("spo", minibatches=2)

    a = Trainer(tiny_causal_lm(), cfg, seed=3)
    a.step(synthetic_batch(8, seed=1))
    path = store.save(tmp_path / "ckpt", a, src, keep=2)
    assert path.name == "step-000001" and latest(tmp_path / "ckpt") == path
    assert (path / "model" / "tokenizer_config.json").exists()  # loadable by vLLM: tokenizer files travel

    from transformers import AutoModelForCausalLM
    b = Trainer(AutoModelForCausalLM.from_pretrained(path / "model", dtype=torch.float32, attn_implementation="eager"),
                cfg, seed=99)
    store.restore(path, b)
    assert b.version == 1 and b.estimator.tracker.state == a.estimator.tracker.state
    batch = synthetic_batch(8, seed=2)
    sa, sb = a.step(batch), b.step(batch)
    assert sa["policy_loss"] == pytest.approx(sb["policy_loss"], abs=1e-6)
    for p, q in zip(a.model.parameters(), b.model.parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0)
    for key in a.estimator.tracker.state:
        assert a.estimator.tracker.state[key] == pytest.approx(b.estimator.tracker.state[key], abs=1e-6)


def test_checkpoints_are_pruned_and_partial_ones_ignored(tmp_path):
    src = tmp_path / "m"
    tiny_causal_lm().save_pretrained(src)
    t = Trainer(tiny_causal_lm(), cfg_for())
    root = tmp_path / "ckpt"
    for v in (1, 2, 3):
        t.version = v
        store.save(root, t, src, keep=2)
    assert sorted(p.name for p in root.glob("step-*")) == ["step-000002", "step-000003"]
    (root / ".tmp-step-000004-1").mkdir()  # a crash mid-write
    (root / "step-000005").mkdir()  # a directory without its trainer state is not a checkpoint
    assert latest(root).name == "step-000003"
    assert not (root / ".tmp-step-000004-1").exists()


def test_value_based_checkpoint_keeps_the_critic(tmp_path):
    cfg = cfg_for("turn_gae")
    a = Trainer(tiny_causal_lm(), cfg)
    a.step(synthetic_batch(6))
    b = Trainer(tiny_causal_lm(), cfg)
    load_file_state(b, file_state(a), a.estimator.state_dict())
    for p, q in zip(a.net.critic_parameters(), b.net.critic_parameters()):
        torch.testing.assert_close(p, q)


@pytest.mark.parametrize("kl_coef", [0.0, 0.05])
def test_fused_proximal_pass_gives_the_same_update(monkeypatch, kl_coef):
    """One optimizer step per batch: pi_prox from the training forward equals a separate no-grad pass."""
    from turnstream.learner.step import trainer as trainer_module

    cfg = cfg_for("spo", kl_coef=kl_coef)
    results = []
    for fuse in (True, False):
        monkeypatch.setattr(trainer_module, "prox_from_training_forward",
                            lambda cfg, estimator, one_microbatch, fuse=fuse: fuse)
        model = tiny_causal_lm()
        t = Trainer(model, cfg, ref_model=copy.deepcopy(model))
        s = t.step(synthetic_batch(8, seed=4))
        results.append((torch.cat([p.detach().reshape(-1) for p in model.parameters()]), s["policy_loss"]))
    assert (results[0][0] - results[1][0]).abs().max().item() < 1e-6
    assert results[0][1] == pytest.approx(results[1][1], abs=1e-6)


@pytest.mark.parametrize("estimator,critic", [("turn_gae", "shared"), ("turn_gae", "separate"),
                                              ("token_gae", "shared")])
def test_values_from_the_training_forward_give_the_same_update_on_one_microbatch(estimator, critic, tmp_path):
    """critic.whiten = microbatch skips the no-grad value pass; with the batch in one micro-batch the
    advantages, targets and so the update are those of whiten = batch."""
    model = tiny_causal_lm()
    model.save_pretrained(tmp_path / "critic")
    results = []
    for whiten in ("batch", "microbatch"):
        cfg = cfg_for(estimator)
        cfg.critic.mode, cfg.critic.whiten = critic, whiten
        t = Trainer(tiny_causal_lm(), cfg, critic_path=str(tmp_path / "critic"))
        s = t.step(synthetic_batch(8, seed=5))
        results.append((torch.cat([p.detach().reshape(-1) for p in t._params()]), s))
    assert (results[0][0] - results[1][0]).abs().max().item() < 1e-6
    # so "auto" (the default) takes the cheaper path exactly there, step by step, and batch whitening where the
    # step's batch splits into micro-batches or is trained in several updates
    auto = cfg_for(estimator)
    assert auto.values_in_step(one_microbatch=True) and not auto.values_in_step(one_microbatch=False)
    assert not cfg_for(estimator, epochs=2).values_in_step(one_microbatch=True)
    for key in ("policy_loss", "value_loss", "explained_variance", "baseline_mean"):
        assert results[0][1][key] == pytest.approx(results[1][1][key], abs=1e-6), key


@pytest.mark.parametrize("budget", [0, 40])
def test_auto_whitening_is_the_batchs_whether_or_not_the_batch_splits(budget, tmp_path):
    """critic.whiten = auto, decided per step: on a batch that fits one micro-batch it reads the values from the
    training forward, on one that splits (a budget of 40 tokens) it whitens over the batch; either way the update
    is whiten = batch's."""
    model = tiny_causal_lm()
    model.save_pretrained(tmp_path / "critic")
    params = []
    for whiten in ("batch", "auto"):
        cfg = cfg_for("turn_gae", max_tokens_per_microbatch=budget)
        cfg.critic.mode, cfg.critic.whiten = "separate", whiten
        t = Trainer(tiny_causal_lm(), cfg, critic_path=str(tmp_path / "critic"))
        t.step(synthetic_batch(8, seed=5))
        params.append(torch.cat([p.detach().reshape(-1) for p in t._params()]))
    assert (params[0] - params[1]).abs().max().item() < 1e-6


def test_the_tiny_models_auto_budget_sorts_long_tailed_episodes_into_micro_batches():
    """"auto" gives the tiny model a token budget, so that a batch with one long episode is not padded to it
    as a whole: the short episodes share micro-batches of their own width."""
    from turnstream.learner.batch.tensors import to_tensors

    trainer = Trainer(tiny_causal_lm(), cfg_for("spo", max_tokens_per_microbatch="auto"))
    assert trainer.cfg.max_tokens_per_microbatch == 4096
    batch = synthetic_batch(64, turns=(2, 3), seed=7)
    long = synthetic_batch(1, turns=(400,), seed=8)
    tb = to_tensors(batch, 64)
    lengths = np.concatenate([tb.lengths, [int(long.tokens.size)]])
    groups = microbatches(lengths, torch.arange(len(lengths)), trainer.cfg.max_tokens_per_microbatch)
    padded = sum(len(g) * int(lengths[g].max()) for g in groups)
    assert len(groups) >= 2 and padded < 2 * lengths.sum()
    assert len(lengths) * lengths.max() > 5 * lengths.sum()  # what one micro-batch would have padded to


def test_microbatch_whitening_standardises_each_microbatch_alone():
    """Under a token budget every micro-batch's advantages have mean 0 and std 1 over its own tokens, and
    are an increasing affine map of the batch-whitened ones (the same GAE, other statistics)."""
    from turnstream.learner.batch.tensors import to_tensors
    from tests import estimator_compute as estimators

    batch = synthetic_batch(12, seed=6)
    tb = to_tensors(batch, 64)
    values = torch.randn(tb.act_tokens.numel(), generator=torch.Generator().manual_seed(0))
    kw = dict(tracker=SpoTracker(), spo_normalize="token", gamma=0.99, lam=0.9, old_values=values)
    whole = estimators.compute("turn_gae", batch, tb, **kw).token_adv
    for rows in microbatches(tb.lengths, torch.arange(tb.num_episodes), budget=40):
        sel = torch.isin(tb.act_episode, rows)
        part = estimators.compute("turn_gae", batch, tb, episodes=rows.numpy(), **kw).token_adv
        assert torch.all(part[~sel] == 0)
        x = part[sel].double()
        if x.numel() > 1 and x.std() > 0:
            assert x.mean().item() == pytest.approx(0, abs=1e-6)
            assert x.std(unbiased=False).item() == pytest.approx(1, abs=1e-4)
            assert np.corrcoef(x.numpy(), whole[sel].double().numpy())[0, 1] == pytest.approx(1, abs=1e-9)


@pytest.mark.parametrize("drift", ["proximal", "updated"])
def test_spo_drift_is_read_at_the_configured_policy(drift):
    """proximal (default): D is |log mu - log pi_prox|, taken from the training forward; updated: D is read
    from the policy after the step. Either way a separate no-grad pass over that policy reproduces it."""
    from tests.learner_logprobs import action_logprobs
    from turnstream.learner.batch.tensors import to_tensors

    cfg = cfg_for("spo")
    cfg.spo.drift = drift
    model = tiny_causal_lm()
    batch = synthetic_batch(8, seed=7)
    tb = to_tensors(batch, 64)
    with torch.no_grad():  # sampled by the initial policy itself: D is 0 at pi_prox, > 0 after the update
        own, _ = action_logprobs(copy.deepcopy(model).eval(), tb)
        batch.behav_logprobs[np.nonzero(batch.action_mask)[0]] = own.numpy()
    tb = to_tensors(batch, 64)
    t = Trainer(model, cfg)
    before = copy.deepcopy(model).eval()
    t.step(batch)
    with torch.no_grad():
        logp, _ = action_logprobs(before if drift == "proximal" else copy.deepcopy(model).eval(), tb)
    expected = SpoTracker()
    fold_batch(expected, batch.prompt_keys, batch.returns, tb, logp)
    assert t.estimator.tracker.state and t.estimator.tracker.state.keys() == expected.state.keys()
    for key, ab in expected.state.items():
        assert t.estimator.tracker.state[key] == pytest.approx(ab, abs=1e-6)


@pytest.mark.parametrize("estimator", ["spo", "turn_gae"])
def test_step_kl_is_the_kl_between_the_policies_before_and_after_the_step(estimator):
    """step_kl: KL(pi_before || pi_after) on the batch's action tokens (k3 on the sampled tokens, token-mean),
    read from the learner's own passes; a separate computation from copies of the two policies agrees. (A batch of
    STEP_KL_MIN_EPISODES: every episode is measured.)"""
    from tests.learner_logprobs import action_logprobs
    from turnstream.learner.batch.tensors import to_tensors
    from turnstream.learner.step.trainer import STEP_KL_MIN_EPISODES

    model = tiny_causal_lm()
    batch = synthetic_batch(STEP_KL_MIN_EPISODES, seed=8)
    tb = to_tensors(batch, 64)
    before = copy.deepcopy(model).eval()
    stats = Trainer(model, cfg_for(estimator)).step(batch)
    with torch.no_grad():
        old, _ = action_logprobs(before, tb)
        new, _ = action_logprobs(copy.deepcopy(model).eval(), tb)
    log_rho = (new - old).double()
    assert stats["step_kl"] == pytest.approx(float((log_rho.exp() - 1 - log_rho).mean()), rel=1e-4, abs=1e-9)
    assert stats["step_kl"] > 0  # lr 1e-2 moves the policy; with one update the clipped ratio cannot show it
    assert stats["approx_kl"] == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize("episodes, measured", [(4, 4), (10, 4), (40, 10), (128, 32), (300, 32)])
def test_step_kl_reads_a_quarter_of_the_batch_within_its_bounds(episodes, measured, monkeypatch):
    """Its forward at the new weights would add a third to a step over the whole batch."""
    trainer = Trainer(tiny_causal_lm(), cfg_for("spo"))
    passes = []
    no_grad_pass = trainer._no_grad_pass

    def counted(tb, allowed, rows=None, **kwargs):
        passes.append(tb.num_episodes if rows is None else len(rows))
        return no_grad_pass(tb, allowed, rows, **kwargs)

    monkeypatch.setattr(trainer, "_no_grad_pass", counted)
    trainer.step(synthetic_batch(episodes, seed=3))
    assert passes[-1] == measured  # the last pass is step_kl's


def test_entropy_bonus_counts_entropy_in_units_of_its_maximum():
    """max_entropy: log of each action token's choice count (allowed set, or the vocabulary)."""
    from turnstream.learner.batch.tensors import max_entropy, to_tensors

    batch = synthetic_batch(4, seed=9, allowed=(5, 6, 7))
    tb = to_tensors(batch, 64)
    assert torch.allclose(max_entropy(tb, 64), torch.full((tb.act_tokens.numel(),), float(np.log(3))))
    tb.mask_id[:] = -1  # unrestricted: the whole vocabulary
    assert torch.allclose(max_entropy(tb, 64), torch.full((tb.act_tokens.numel(),), float(np.log(64))))


def test_outcome_variance_weighs_the_bonus_by_how_uncertain_a_tasks_outcome_is():
    """entropy_weight outcome_variance: 4 v (1 - v) of SPO's estimate v for the episode's task, over the unit; uniform
    1 over the unit; no bonus, no scale. (Only with spo: tests/unit/test_config.py.)"""
    from turnstream.learner.batch.tensors import max_entropy, to_tensors
    from turnstream.learner.step.entropy_bonus import entropy_scale

    batch = synthetic_batch(4, seed=9, allowed=(5, 6, 7))
    tb = to_tensors(batch, 64)
    spo = Spo(cfg_for("spo"))
    tracker = spo.tracker
    tracker.state[batch.prompt_keys[0]] = (9.0, 1.0)  # v = 0.9: nearly settled
    tracker.state[batch.prompt_keys[1]] = (1.0, 9.0)  # v = 0.1: failing so far
    v = tracker.values(batch.prompt_keys)  # unseen tasks: 0.5, a coin toss
    expected = torch.from_numpy((4 * v * (1 - v)).astype(np.float32))[tb.act_episode] / max_entropy(tb, 64)
    weighted = entropy_scale(cfg_for("spo", entropy_weight="outcome_variance"), batch, tb, spo, 64)
    assert torch.allclose(weighted, expected)
    assert sorted(set(np.round(4 * v * (1 - v), 6))) == [0.36, 1.0]
    assert torch.allclose(entropy_scale(cfg_for("spo"), batch, tb, spo, 64), 1 / max_entropy(tb, 64))
    assert entropy_scale(cfg_for("spo", entropy_coef=0.0), batch, tb, spo, 64) is None


def test_a_step_under_outcome_variance_trains_less_bonus_on_settled_tasks():
    """The same batch, the bonus weighted uniformly and by outcome variance: a task the tracker holds as settled
    (v near 1) gets almost no bonus, so the two steps differ, and with every task a coin toss (v = 1/2) they agree."""
    batch = synthetic_batch(8, seed=3, allowed=(5, 6))

    def params_after(weight: str, settled: bool) -> torch.Tensor:
        trainer = Trainer(tiny_causal_lm(seed=0), cfg_for("spo", entropy_coef=0.5, entropy_weight=weight), seed=0)
        if settled:
            for k in batch.prompt_keys:
                trainer.estimator.tracker.state[k] = (99.0, 1.0)
        trainer.step(batch)
        return torch.cat([p.detach().reshape(-1) for p in trainer._params()])

    assert torch.equal(params_after("uniform", settled=False), params_after("outcome_variance", settled=False))
    assert not torch.equal(params_after("uniform", settled=True), params_after("outcome_variance", settled=True))
