"""Data parallel over 2 gloo ranks on CPU gives the one-rank update on the same batches."""
from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from tests.learner_batches import dp_worker, params_after_steps, tiny_causal_lm
from turnstream.core.config import LearnerSection

# Measured max |difference| over all parameters after 2 AdamW steps at lr 1e-2: 1.2e-6 (float32 summation
# order of the gradient all-reduce; Adam's normalisation makes tiny gradient entries move by ~lr regardless
# of their size, which amplifies it). Parameters moved by > 1e-3 in the same steps. Bound: 1e-5.
TOLERANCE = 1e-5


@pytest.mark.parametrize("estimator, budget, critic, whiten", [
    ("turn_gae", 40, "shared", "batch"),  # several micro-batches per rank, critic head in the reduced network
    ("turn_gae", 40, "separate", "batch"),  # a second model (its unused LM head frozen) reduced with the policy
    ("turn_gae", 40, "shared", "microbatch"),  # values from each rank's training forwards, summed for the stats
    ("spo", 0, "shared", "batch"),  # one micro-batch in all: rank 1 has none, joins the reduction with zero grad
])
def test_two_gloo_ranks_match_one_rank(tmp_path, estimator, budget, critic, whiten):
    cfg = LearnerSection(estimator=estimator, lr=1e-2, max_tokens_per_microbatch=budget, device="cpu")
    cfg.critic.mode, cfg.critic.whiten = critic, whiten
    critic_path = ""
    if critic == "separate":
        critic_path = str(tmp_path / "critic")
        tiny_causal_lm(seed=1).save_pretrained(critic_path)
    one_rank = params_after_steps(cfg, critic_path=critic_path)
    mp.spawn(dp_worker, args=(2, str(tmp_path / "init"), cfg, str(tmp_path), critic_path), nprocs=2, join=True)
    r0, r1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert torch.equal(r0, r1)  # ranks stay in lockstep
    diff = (r0 - one_rank).abs().max().item()
    print(f"max |2 ranks - 1 rank| = {diff:.3g}")
    assert diff < TOLERANCE
    assert (one_rank - params_after_steps(cfg, steps=0, critic_path=critic_path)).abs().max() > 1e-3  # it trained
