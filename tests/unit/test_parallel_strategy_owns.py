"""The parallel strategy owns what differs between one process, DDP and FSDP2 beyond placing the network: the
format its checkpoints are written in (learner/checkpoint/formats.py, picked with the strategy) and the scaling
of a micro-batch's loss for the reduction over ranks. Nothing outside learner/parallel/ asks which it is."""
from __future__ import annotations

import pytest
import torch

from tests.learner_batches import synthetic_batch, tiny_causal_lm
from turnstream.core.config import LearnerSection
from turnstream.learner.checkpoint import sharded, store
from turnstream.learner.checkpoint.formats import Sharded, SingleFile
from turnstream.learner.device import placement
from turnstream.learner.parallel.choose import strategy_for
from turnstream.learner.step.trainer import Trainer


def _trainer(parallel: str) -> Trainer:
    cfg = LearnerSection(estimator="spo", lr=1e-2, max_tokens_per_microbatch=40, device="cpu", parallel=parallel)
    return Trainer(tiny_causal_lm(seed=0), cfg, seed=0)


@pytest.mark.parametrize(("parallel", "written"), [("ddp", SingleFile), ("fsdp2", Sharded)])
def test_one_process_keeps_the_checkpoint_format_of_its_parallel_mode(parallel, written):
    strategy = strategy_for(parallel, placement("cpu"))
    assert strategy.world == 1 and type(strategy.checkpoint_format) is written


def test_a_checkpoint_is_written_in_the_format_the_strategy_holds(tmp_path):
    src = tmp_path / "src"
    tiny_causal_lm(seed=0).save_pretrained(src)
    trainer = _trainer("ddp")
    trainer.step(synthetic_batch(8, group=4, seed=1))
    plain = store.save(tmp_path / "plain", trainer, src, keep=2)
    assert not sharded.is_sharded(plain) and list((plain / "model").glob("*.safetensors"))
    trainer.parallel.checkpoint_format = Sharded()
    assert store.writes_sharded(trainer)
    shards = store.save(tmp_path / "shards", trainer, src, keep=2, tmp="tmp")
    assert sharded.is_sharded(shards) and not list((shards / "model").glob("*.safetensors"))


def test_every_backward_of_a_step_goes_through_the_strategy():
    trainer = _trainer("ddp")
    scaled: list[bool] = []
    backward = trainer.parallel.backward

    def recorded(loss: torch.Tensor, own: bool) -> None:
        scaled.append(own)
        backward(loss, own)

    trainer.parallel.backward = recorded
    trainer.step(synthetic_batch(8, group=4, seed=1))
    assert scaled and all(scaled)  # one process: every micro-batch is its own
