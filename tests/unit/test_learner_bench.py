"""bench/learner.py and bench/estimators.py run end to end on tiny settings and print one JSON line last."""
from __future__ import annotations

import json

from bench import estimators, learner


def last_json(capsys) -> dict:
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    return json.loads(lines[-1])


def test_bench_learner_smoke(capsys):
    assert learner.main(["--episodes", "8", "--steps", "1", "--estimators", "grpo,spo_updated,turn_gae_microbatch",
                         "--pack-sequences", "false"]) == 0
    out = last_json(capsys)
    assert out["pack_sequences"] == "false"
    assert out["grpo_ratio"] > 0 and out["spo_updated_tokens_per_s"] > 0 and out["bare_tokens_per_s"] > 0
    assert out["turn_gae_microbatch_ratio"] > 0


def test_bench_estimators_smoke(capsys):
    args = ["--envs", "goal_walk_cued", "--estimators", "rloo,turn_gae", "--max-steps", "2", "--batch", "16",
            "--group", "4", "--window", "16"]
    assert estimators.main(args) == 0
    out = last_json(capsys)
    assert set(out["results"]) == {"goal_walk_cued/rloo", "goal_walk_cued/turn_gae"}
    assert out["sampler"] == "in-process torch"


def test_sampler_respects_the_allowed_tokens_and_reports_their_logprobs():
    import math

    import torch

    from tests.learner_batches import tiny_causal_lm

    sampler = estimators.TorchSampler(tiny_causal_lm(), 0.7, torch.Generator().manual_seed(0))
    tokens, logps = sampler.sample([[1, 2, 3], [4, 5]], allowed=[7, 9])
    assert set(tokens) <= {7, 9}
    assert all(lp <= 0 and math.isfinite(lp) for lp in logps)


def test_bench_learner_mfu_mode_at_tiny_size(capsys):
    """The GPU benchmark's code path, on the CPU at the tiny size: real Trainer steps on packed rows."""
    args = ["--model-config", "tiny", "--device", "cpu", "--seq-len", "256", "--microbatches", "2", "--steps", "1"]
    assert learner.main(args) == 0
    out = last_json(capsys)
    assert out["device"] == "cpu" and out["precision"] == "fp32" and out["mfu"] is None  # no CPU peak claimed
    assert out["tokens_per_s"] > 0 and out["step_s"] > 0 and out["model_tflops_per_step"] > 0
    assert out["tokens_per_step"] <= out["microbatches_per_step"] * 256 and 0 < out["packing_efficiency"] <= 1
    assert out["peak_memory_gib"] > 0 and "6*N_body*T" in out["mfu_formula"]


def test_mfu_flops_formula():
    from bench.learner_mfu import model_config, step_flops

    cfg = model_config("1.5b")
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (28, 1536, 151936)
    # dense + LM head at action positions + causal attention over each packed episode
    assert step_flops(cfg, 10, 100, 7, 50) == 6 * 10 * 100 + 6 * 151936 * 1536 * 7 + 6 * 28 * 12 * 128 * 50
