"""The learner on a CUDA device: placement, bf16 autocast, packing with the GPU attention kernels,
activation checkpointing's memory saving, the dtype of pushed weights and the benchmark's MFU.

Marked `gpu` and skipped (reported as skipped, with the reason) where torch sees no CUDA device.
Run on a GPU machine with `bash benchmarks/gpu_check.sh`, or `python -m pytest tests/gpu -m gpu -rs`.
"""
from __future__ import annotations

import json

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason=f"no CUDA device visible to torch {torch.__version__}")]


def _tiny_lm(attn: str = "sdpa"):
    from transformers import AutoModelForCausalLM

    from benchmarks.learner_mfu import model_config

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(model_config("tiny"), attn_implementation=attn, dtype=torch.float32)


def _batch(seed: int = 0, seq_len: int = 512, microbatches: int = 4):
    from benchmarks.learner_mfu import model_config, synthetic_batch

    return synthetic_batch(model_config("tiny").vocab_size, seq_len, microbatches, 4, seed)


def _grads(trainer, batch) -> torch.Tensor:
    """The accumulated gradient of one step, as the optimizer receives it (Adam's first step is close to
    sign descent, so comparing moved weights would magnify noise in near-zero gradients)."""
    out = []
    trainer.optimizer.register_step_pre_hook(lambda *_: out.append(
        torch.cat([p.grad.float().reshape(-1).cpu() for p in trainer.model.parameters()])))
    trainer.step(batch)
    return out[0]


def test_auto_picks_cuda_and_bf16_with_fp32_master_weights_and_fused_adamw():
    from turnstream.learner.device import placement
    from turnstream.learner.step.trainer import Trainer
    from turnstream.core.config import LearnerSection

    where = placement("auto", "auto")
    assert where.device.type == "cuda" and where.compute_dtype is torch.bfloat16
    model = _tiny_lm()
    t = Trainer(model, LearnerSection(estimator="grpo", lr=1e-3, max_tokens_per_microbatch=512), where=where)
    stats = t.step(_batch())
    assert all(p.device.type == "cuda" and p.dtype is torch.float32 for p in model.parameters())
    assert t.optimizer.defaults.get("fused") is True
    assert stats["grad_norm"] > 0 and stats["policy_loss"] == stats["policy_loss"]


def test_cuda_bf16_gradient_matches_the_cpu_fp32_gradient():
    from turnstream.learner.device import Placement
    from turnstream.learner.step.trainer import Trainer
    from turnstream.core.config import LearnerSection

    grads = []
    for where in (Placement(torch.device("cpu"), None), Placement(torch.device("cuda"), torch.bfloat16)):
        cfg = LearnerSection(estimator="grpo", lr=1e-3, max_tokens_per_microbatch=512, max_grad_norm=1e9)
        grads.append(_grads(Trainer(_tiny_lm(), cfg, where=where), _batch(seed=1)))
    assert torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0) > 0.99


@pytest.mark.parametrize("attn", ["sdpa", "flash_attention_2"])
def test_packed_rows_equal_padded_rows_on_the_gpu_kernels(attn):
    from transformers.utils import is_flash_attn_2_available

    from turnstream.learner.batch import forward
    from turnstream.learner.batch.tensors import logprobs_from_action_logits, to_tensors

    if attn == "flash_attention_2" and not is_flash_attn_2_available():
        pytest.skip("flash-attn is not installed")
    model = _tiny_lm(attn).cuda().eval()
    tb = to_tensors(_batch(seed=2, microbatches=1), model.config.vocab_size)
    rows = torch.arange(tb.num_episodes)
    out = {}
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for packed in (True, False):
            if attn == "flash_attention_2" and not packed:
                model.config._attn_implementation = "sdpa"  # flash-attention's padded path is not the question
            mb = forward.build(tb, rows, packed, "cuda")
            logits = forward.action_logits(model, mb).logits
            out[packed] = logprobs_from_action_logits(logits, tb.temperature.cuda(), tb.mask_id.cuda(),
                                                      tb.allowed.cuda(), tb.act_tokens.cuda())[0].float().cpu()
    assert (out[True] - out[False]).abs().max().item() < 0.05  # bf16 logits: a few 1e-3 typical


def test_activation_checkpointing_lowers_peak_memory_with_the_same_gradient():
    from turnstream.learner.device import placement
    from turnstream.learner.step.trainer import Trainer
    from turnstream.core.config import LearnerSection

    peaks, grads = {}, {}
    for ckpt in (False, True):
        t = Trainer(_tiny_lm(), LearnerSection(estimator="grpo", lr=1e-3, max_tokens_per_microbatch=4096,
                                               max_grad_norm=1e9, activation_checkpointing=ckpt),
                    where=placement("cuda", "fp32"))
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        grads[ckpt] = _grads(t, _batch(seed=3, seq_len=4096, microbatches=2))
        torch.cuda.synchronize()
        peaks[ckpt] = torch.cuda.max_memory_allocated()
        del t
        torch.cuda.empty_cache()
    print(f"peak memory without/with checkpointing: {peaks[False] / 2**20:.0f} / {peaks[True] / 2**20:.0f} MiB")
    assert peaks[True] < peaks[False]
    assert ((grads[True] - grads[False]).norm() / grads[False].norm()).item() < 1e-4  # fp32 recompute


def test_pushed_weights_are_cast_to_the_served_dtype(tmp_path):
    from safetensors import safe_open

    from turnstream.learner.weights.source import serving_state_dict
    from turnstream.learner.sync.disk import DiskWeightSync
    from turnstream.learner.weights.buckets import WeightBuckets

    model = _tiny_lm().cuda()
    state = serving_state_dict(model, torch.bfloat16)
    assert {t.dtype for t in state.values()} == {torch.bfloat16} and next(iter(state.values())).is_cuda
    model.config.save_pretrained(tmp_path / "model")
    path = DiskWeightSync([], tmp_path / "w", tmp_path / "model").save(WeightBuckets(state, None), 1)
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}


def test_bench_reports_mfu_on_the_gpu(capsys):
    from benchmarks import learner

    assert learner.main(["--model-config", "tiny", "--device", "cuda", "--seq-len", "1024", "--microbatches", "2",
                         "--steps", "2"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["precision"] == "bf16" and out["peak_memory_gib"] > 0 and out["tokens_per_s"] > 0
    if out["peak_tflops"] is not None:
        assert 0 < out["mfu"] < 1
