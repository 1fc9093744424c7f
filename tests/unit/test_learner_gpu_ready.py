"""The learner's GPU features, checked on the CPU: device choice, bf16 autocast, activation checkpointing,
packing without padding, micro-batch accumulation, the over-budget error, and the dtype of pushed weights."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from turnstream.learner.batch import forward
from turnstream.learner.batch.tensors import logprobs_from_action_logits, to_tensors
from turnstream.learner.device import Placement, placement, resolve_device, served_dtype
from turnstream.learner.metrics import LearnerMetrics
from turnstream.learner.step.packing import SequenceTooLong, drop_out_of_vocabulary, drop_over_budget, microbatches
from turnstream.learner.weights.source import serving_state_dict
from turnstream.learner.step.trainer import NothingToTrain, Trainer
from tests.learner_batches import params_after_steps, synthetic_batch, tiny_causal_lm
from turnstream.core.config import LearnerSection
from turnstream.core.configtools import ConfigError, from_dict

CPU_FP32 = Placement(torch.device("cpu"), None)
CPU_BF16 = Placement(torch.device("cpu"), torch.bfloat16)


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback; this machine has CUDA")
def test_device_auto_is_cpu_without_cuda():
    where = placement("auto", "auto")
    assert where.device.type == "cpu" and where.compute_dtype is None and where.precision == "fp32"
    assert placement("auto", "bf16").compute_dtype is torch.bfloat16  # asked for: bf16 also on a CPU
    with pytest.raises(ConfigError, match="learner.device: cuda asked for"):
        resolve_device("cuda")


def test_device_and_precision_are_validated():
    for bad, field in ((dict(device="tpu"), "device"), (dict(precision="fp8"), "precision")):
        with pytest.raises(ConfigError, match=f"learner.{field}"):
            from_dict(LearnerSection, bad, "learner")
    from_dict(LearnerSection, dict(device="cuda:1", precision="bf16"), "learner")


def test_bf16_autocast_on_cpu_keeps_fp32_master_weights():
    seen = []
    start = flat(tiny_causal_lm())
    model = tiny_causal_lm()
    model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    t = Trainer(model, LearnerSection(estimator="grpo", lr=1e-2, precision="bf16"), where=CPU_BF16)
    stats = t.step(synthetic_batch(12, group=4, seed=7))
    assert seen and all(d is torch.bfloat16 for d in seen)  # the matmuls ran in bf16
    assert all(p.dtype is torch.float32 for p in model.parameters())  # master weights fp32
    assert all(v.dtype is torch.float32 for s in t.optimizer.state.values() for v in s.values()
               if torch.is_tensor(v) and v.is_floating_point())  # and the AdamW moments
    assert np.isfinite(stats["policy_loss"]) and stats["grad_norm"] > 0
    # the same step in fp32 moves the weights the same way, up to bf16 rounding
    ref = tiny_causal_lm()
    Trainer(ref, LearnerSection(estimator="grpo", lr=1e-2), where=CPU_FP32).step(synthetic_batch(12, group=4, seed=7))
    cos = torch.nn.functional.cosine_similarity(flat(model) - start, flat(ref) - start, dim=0)
    assert cos > 0.9, cos


def test_activation_checkpointing_gives_the_same_update_and_recomputes():
    calls = {"plain": 0, "checkpointed": 0}
    results = {}
    for name, ckpt in (("plain", False), ("checkpointed", True)):
        cfg = LearnerSection(estimator="spo", lr=1e-2, activation_checkpointing=ckpt)
        model = tiny_causal_lm()
        # a pre-hook: the recompute stops early (torch's checkpoint early stop), before a forward hook would run
        model.model.layers[0].register_forward_pre_hook(lambda *a, n=name: calls.__setitem__(n, calls[n] + 1))
        t = Trainer(model, cfg, where=CPU_FP32)
        t.step(synthetic_batch(8, seed=3))
        results[name] = flat(model)
    assert (results["plain"] - results["checkpointed"]).abs().max().item() < 1e-6
    assert calls["checkpointed"] > calls["plain"]  # the layer's forward ran again during backward


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_packed_rows_give_the_padded_update(agg):
    packed = params_after_steps(LearnerSection(estimator="grpo", lr=1e-2, loss_agg=agg, pack_sequences=True,
                                               max_tokens_per_microbatch=40, device="cpu"))
    padded = params_after_steps(LearnerSection(estimator="grpo", lr=1e-2, loss_agg=agg, pack_sequences=False,
                                               max_tokens_per_microbatch=40, device="cpu"))
    assert (packed - padded).abs().max().item() < 1e-5


def test_packed_log_probs_equal_padded_ones():
    """No token attends across episodes in a packed row, and each episode's positions restart at 0."""
    model = tiny_causal_lm().eval()
    tb = to_tensors(synthetic_batch(6, seed=5), 64)
    rows = torch.arange(tb.num_episodes)
    out = {}
    with torch.no_grad():
        for packed in (True, False):
            mb = forward.build(tb, rows, packed)
            logits = forward.action_logits(model, mb, ).logits
            out[packed] = logprobs_from_action_logits(logits, tb.temperature, tb.mask_id, tb.allowed, tb.act_tokens)[0]
    assert mb.input_ids.shape[0] == 6 and forward.build(tb, rows, True).input_ids.shape[0] == 1
    torch.testing.assert_close(out[True], out[False], atol=1e-5, rtol=0)


def test_many_micro_batches_accumulate_to_the_full_batch_update():
    """The loss weights are batch-global, so summing micro-batch gradients is the full-batch gradient."""
    batch = synthetic_batch(12, group=4, seed=11)
    longest = int(np.diff(batch.episode_offsets).max())
    grads = {}
    for budget in (0, longest):  # one micro-batch, or as many as the budget forces
        model = tiny_causal_lm()
        t = Trainer(model, LearnerSection(estimator="grpo", lr=1e-2, max_tokens_per_microbatch=budget,
                                          max_grad_norm=1e9), where=CPU_FP32)
        t.optimizer.register_step_pre_hook(  # the accumulated gradients, as the optimizer receives them
            lambda *_, b=budget, m=model: grads.__setitem__(b, torch.cat([p.grad.reshape(-1) for p in m.parameters()])))
        t.step(batch)
    n = len(microbatches(np.diff(batch.episode_offsets), torch.arange(12), longest, packed=True))
    assert n >= 4
    torch.testing.assert_close(grads[0], grads[longest], atol=1e-6, rtol=1e-5)


def test_an_over_budget_episode_raises_a_clear_error_and_is_dropped_and_counted():
    batch = synthetic_batch(8, seed=2)
    lengths = np.diff(batch.episode_offsets)
    longest = int(np.argmax(lengths))
    budget = int(np.sort(lengths)[-2])  # every episode fits but the longest
    assert lengths[longest] > budget
    with pytest.raises(SequenceTooLong) as info:
        microbatches(lengths, torch.arange(8), budget, packed=True, names=batch.episode_ids)
    msg = str(info.value)
    assert "\n" not in msg and batch.episode_ids[longest] in msg and f"{lengths[longest]} tokens" in msg
    assert f"max_tokens_per_microbatch = {budget}" in msg and "raise the budget" in msg

    kept, errors = drop_over_budget(batch, budget)
    assert [e.episode for e in errors] == [batch.episode_ids[longest]]
    assert len(kept.episode_ids) == 7 and kept.tokens.size == batch.tokens.size - lengths[longest]
    t = Trainer(tiny_causal_lm(), LearnerSection(estimator="spo", lr=1e-2, max_tokens_per_microbatch=budget),
                where=CPU_FP32)
    stats = t.step(batch)  # the step goes on without it
    assert stats["dropped_over_budget"] == 1 and stats["episodes"] == 7
    assert stats["dropped_over_budget_ids"] == [batch.episode_ids[longest]]
    metrics = LearnerMetrics()
    metrics.record(stats)
    assert metrics.registry.get_sample_value("turnstream_learner_over_budget_episodes_total") == 1
    with pytest.raises(NothingToTrain) as all_over:  # nothing left: the learner skips the batch (main.py)
        Trainer(tiny_causal_lm(), LearnerSection(max_tokens_per_microbatch=1), where=CPU_FP32).step(batch)
    assert all_over.value.over_budget == 8 and all_over.value.bad_tokens == 0
    assert isinstance(all_over.value, ValueError)


@pytest.mark.parametrize("bad_token", [64, 1000, -1])
def test_an_episode_with_token_ids_outside_the_vocabulary_is_dropped_and_counted_not_the_batch(bad_token):
    batch = synthetic_batch(6, seed=3)
    vocab = tiny_causal_lm().config.vocab_size
    assert vocab == 64
    batch.tokens = batch.tokens.copy()
    batch.tokens[batch.episode_offsets[2] + 1] = bad_token  # the second token of episode 2
    kept, bad = drop_out_of_vocabulary(batch, vocab)
    assert bad == [batch.episode_ids[2]]
    assert kept.episode_ids == batch.episode_ids[:2] + batch.episode_ids[3:]
    assert (kept.tokens >= 0).all() and (kept.tokens < vocab).all()

    stats = Trainer(tiny_causal_lm(), LearnerSection(estimator="spo", lr=1e-2), where=CPU_FP32).step(batch)
    assert stats["episodes"] == 5 and stats["dropped_bad_tokens"] == 1
    assert stats["dropped_bad_tokens_ids"] == [batch.episode_ids[2]]
    metrics = LearnerMetrics()
    metrics.record(stats)
    assert metrics.registry.get_sample_value("turnstream_learner_bad_token_episodes_total") == 1

    batch.tokens[batch.episode_offsets[:-1]] = bad_token  # the first token of every episode
    with pytest.raises(NothingToTrain) as nothing_left:
        Trainer(tiny_causal_lm(), LearnerSection(), where=CPU_FP32).step(batch)
    assert nothing_left.value.bad_tokens == 6 and "outside the vocabulary" in str(nothing_left.value)


def test_a_batch_without_bad_tokens_is_kept_whole():
    batch = synthetic_batch(4, seed=1)
    kept, bad = drop_out_of_vocabulary(batch, 64)
    assert kept is batch and bad == []


def test_pushed_weights_have_the_served_dtype(tmp_path):
    from safetensors import safe_open

    from turnstream.learner.sync.disk import DiskWeightSync
    from turnstream.learner.weights.buckets import WeightBuckets

    model = tiny_causal_lm()
    model.save_pretrained(tmp_path / "model")
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    config.pop("torch_dtype", None)
    config["dtype"] = "bfloat16"  # a checkpoint published in bf16, as most are
    (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    assert served_dtype("auto", tmp_path / "model") is torch.bfloat16  # the checkpoint's own dtype
    assert served_dtype("float32", tmp_path / "model") is torch.float32  # vllm.dtype wins when set
    with pytest.raises(ConfigError, match="vllm.dtype"):
        served_dtype("int3", tmp_path / "model")
    for dtype in (torch.bfloat16, torch.float32):
        sync = DiskWeightSync([], tmp_path / f"w-{dtype}", tmp_path / "model")
        path = sync.save(WeightBuckets(serving_state_dict(model, dtype), None), 1)
        with safe_open(str(path / "model.safetensors"), "pt") as f:
            assert {f.get_tensor(k).dtype for k in f.keys()} == {dtype}
    assert all(p.dtype is torch.float32 for p in model.parameters())  # the master copy is untouched


def test_dropping_episodes_equals_flattening_only_the_kept_ones():
    """learner.packing.subset keeps every Batch field consistent: per token, per episode and per turn."""
    import dataclasses

    from turnstream.buffer.store.episodes import Episode, flatten
    from turnstream.learner.step.packing import subset
    from turnstream.protocol.messages import TurnChunk

    rng = np.random.default_rng(0)
    episodes = []
    for e in range(5):
        ep = Episode(f"e{e}", ("a", 0), f"p{e}")
        k = int(rng.integers(1, 4))
        for t in range(k):
            ep.add(TurnChunk(actor_id="a", epoch=0, seq=e * 10 + t, episode_id=f"e{e}", turn=t, prompt_key=f"p{e}",
                             obs_tokens=rng.integers(1, 60, int(rng.integers(2, 9))).astype(np.int32),
                             gen_tokens=rng.integers(1, 60, 2).astype(np.int32),
                             gen_logprobs=np.full(2, -0.5, np.float32), gen_versions=np.ones(2, np.int32),
                             reward=float(t), done=t == k - 1, allowed_tokens=np.zeros(0, np.int32)))
        episodes.append(ep)
    keep = np.array([0, 2, 3])
    got = subset(flatten(episodes, 1, 2, 0), keep)
    want = flatten([episodes[i] for i in keep], 1, 2, 0)
    for f in dataclasses.fields(want):
        a, b = getattr(got, f.name), getattr(want, f.name)
        assert (np.array_equal(a, b) if isinstance(b, np.ndarray) else a == b), f.name


def test_packing_refuses_a_transformers_without_packed_sequence_masks(monkeypatch):
    import transformers.masking_utils as mu

    monkeypatch.delattr(mu, "find_packed_sequence_indices")
    with pytest.raises(ConfigError, match="learner.pack_sequences"):
        Trainer(tiny_causal_lm(), LearnerSection(max_tokens_per_microbatch=64, pack_sequences=True), where=CPU_FP32)
    Trainer(tiny_causal_lm(), LearnerSection(pack_sequences=False), where=CPU_FP32)  # padded rows still work


def test_auto_packs_only_where_attention_skips_the_other_episodes_of_a_row():
    budget = LearnerSection(max_tokens_per_microbatch=64)
    assert budget.pack_sequences == "auto"
    assert not Trainer(tiny_causal_lm(), budget, where=CPU_FP32).packed  # sdpa: a packed row's full square
    flex = tiny_causal_lm()
    flex.config._attn_implementation = "flex_attention"  # block mask: skips the other episodes
    assert Trainer(flex, budget, where=CPU_FP32).packed
    forced = LearnerSection(max_tokens_per_microbatch=64, pack_sequences=True)
    assert Trainer(tiny_causal_lm(), forced, where=CPU_FP32).packed


def test_without_a_budget_the_batch_is_not_packed_into_one_row():
    # one row of a whole batch would cost its length squared in sdpa attention (no cu_seqlens on the CPU)
    assert not Trainer(tiny_causal_lm(), LearnerSection(max_tokens_per_microbatch=0, pack_sequences=True),
                       where=CPU_FP32).packed
    assert Trainer(tiny_causal_lm(), LearnerSection(max_tokens_per_microbatch=64, pack_sequences=True),
                   where=CPU_FP32).packed
