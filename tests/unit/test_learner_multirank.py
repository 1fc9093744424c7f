"""Data parallel over 2 gloo ranks on CPU gives the one-rank update on the same batches."""
from __future__ import annotations

import torch
import torch.multiprocessing as mp

from tests.learner_batches import dp_worker, params_after_steps
from turnstream.config import LearnerSection

# Measured max |difference| over all parameters after 2 AdamW steps at lr 1e-2: 1.2e-6 (float32 summation
# order of the gradient all-reduce; Adam's normalisation makes tiny gradient entries move by ~lr regardless
# of their size, which amplifies it). Parameters moved by > 1e-3 in the same steps. Bound: 1e-5.
TOLERANCE = 1e-5


def test_two_gloo_ranks_match_one_rank(tmp_path):
    cfg = LearnerSection(estimator="turn_gae", lr=1e-2, max_tokens_per_microbatch=40, device="cpu")
    one_rank = params_after_steps(cfg)
    mp.spawn(dp_worker, args=(2, str(tmp_path / "init"), cfg, str(tmp_path)), nprocs=2, join=True)
    r0, r1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert torch.equal(r0, r1)  # ranks stay in lockstep
    diff = (r0 - one_rank).abs().max().item()
    print(f"max |2 ranks - 1 rank| = {diff:.3g}")
    assert diff < TOLERANCE
    assert (one_rank - params_after_steps(LearnerSection(estimator="turn_gae", lr=1e-2, device="cpu"), steps=0)).abs().max() > 1e-3
