"""bench/learner.py and bench/estimators.py run end to end on tiny settings and print one JSON line last."""
from __future__ import annotations

import json

from bench import estimators, learner


def last_json(capsys) -> dict:
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    return json.loads(lines[-1])


def test_bench_learner_smoke(capsys):
    assert learner.main(["--episodes", "8", "--steps", "1", "--estimators", "grpo,spo_prox"]) == 0
    out = last_json(capsys)
    assert out["grpo_ratio"] > 0 and out["spo_prox_tokens_per_s"] > 0 and out["bare_tokens_per_s"] > 0


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
