"""learner/parallel/fsdp2.py without a process group: fsdp2 asked with one process trains unsharded (with a log line),
and the clip equals torch's."""
from __future__ import annotations

import logging

import pytest
import torch

from tests.learner_batches import params_after_steps, tiny_causal_lm
from turnstream.core.config import LearnerSection
from turnstream.core.configtools import ConfigError
from turnstream.learner.parallel import fsdp2
from turnstream.learner.parallel.strategy import clip_grad_norm


def test_fsdp2_with_one_process_trains_as_plain_training(caplog):
    cfg = LearnerSection(estimator="spo", lr=1e-2, max_tokens_per_microbatch=40, device="cpu")
    with caplog.at_level(logging.INFO, logger="turnstream.learner"):
        sharded = params_after_steps(cfg.model_copy(update={"parallel": "fsdp2"}))
    assert "fsdp2 with one process" in caplog.text
    assert torch.equal(sharded, params_after_steps(cfg))


def test_clip_grad_norm_matches_torch_on_plain_tensors():
    a, b = tiny_causal_lm(seed=0), tiny_causal_lm(seed=0)
    for model in (a, b):
        model(input_ids=torch.arange(1, 9)[None], labels=torch.arange(1, 9)[None]).loss.mul(50).backward()
    expected = torch.nn.utils.clip_grad_norm_(list(a.parameters()), 0.5)
    assert clip_grad_norm(list(b.parameters()), 0.5) == pytest.approx(float(expected), rel=1e-6)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-6, atol=0)


def test_a_model_without_named_decoder_layers_gets_a_readable_refusal():
    with pytest.raises(ConfigError, match="learner.parallel: fsdp2 found no decoder layers"):
        fsdp2.decoder_layers(torch.nn.Linear(2, 2))
