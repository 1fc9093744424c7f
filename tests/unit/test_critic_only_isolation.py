"""Episodes served to the critic alone (Batch.critic_only, buffer.critic_replay) cannot move the policy, in either
critic mode: on a step after the first (the value head no longer zero), a batch with critic-only episodes leaves
every policy parameter and its AdamW state bit for bit where the same batch without them does, with the
gradient-norm clip biting, while the critic learns from them."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tests.learner_batches import synthetic_batch, tiny_causal_lm
from turnstream.core.config import LearnerSection
from turnstream.learner.step.packing import subset
from turnstream.learner.step.trainer import Trainer

FRESH = 4
CRITIC_ONLY = 3


def policy_state(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Every policy parameter and its AdamW moments and step count, by name."""
    out = {}
    for name, p in trainer.net.model.named_parameters():
        out[name] = p.detach().clone()
        for key, value in trainer.optimizer.state[p].items():
            out[f"{name}.{key}"] = value.clone()
    return out


def critic_state(trainer: Trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.net.critic_parameters()]


def value_head(trainer: Trainer) -> torch.nn.Module:
    return trainer.net.head if trainer.net.head is not None else trainer.net.critic.head


@pytest.mark.parametrize("mode, fields", [
    ("shared", {}),  # the default: one micro-batch, the critic read in the training forward
    ("shared", {"max_tokens_per_microbatch": 40}),  # several micro-batches, a no-grad pass for the values
    ("shared", {"max_tokens_per_microbatch": 40, "minibatches": 2}),  # two updates: the rows are shuffled
    ("separate", {"max_tokens_per_microbatch": 40}),
])
def test_critic_only_episodes_leave_the_policy_and_its_optimizer_state_exactly_as_without_them(mode, fields,
                                                                                                tmp_path):
    cfg = LearnerSection(estimator="turn_gae", lr=1e-2, device="cpu", **fields)
    cfg.critic.mode = mode
    assert cfg.max_grad_norm == 1.0  # the default clip, on
    model = tiny_causal_lm()
    model.save_pretrained(tmp_path / "critic")
    with_old = Trainer(copy.deepcopy(model), cfg, critic_path=str(tmp_path / "critic"))
    fresh_only = Trainer(model, cfg, critic_path=str(tmp_path / "critic"))
    first = synthetic_batch(FRESH, seed=1)
    with_old.step(first)
    fresh_only.step(first)
    assert all(bool(p.abs().sum() > 0) for p in value_head(with_old).parameters())  # no longer zero
    critic_before = critic_state(with_old)

    batch = synthetic_batch(FRESH + CRITIC_ONLY, seed=5)
    batch.critic_only = np.array([False] * FRESH + [True] * CRITIC_ONLY)
    stats = with_old.step(batch)
    fresh_stats = fresh_only.step(subset(batch, np.arange(FRESH)))

    assert fresh_stats["grad_norm"] > cfg.max_grad_norm  # the clip bites: a shared norm would couple the two
    assert (stats["episodes"], stats["critic_only"]) == (FRESH, CRITIC_ONLY)
    assert stats["grad_norm"] == fresh_stats["grad_norm"]
    assert stats["policy_loss"] == fresh_stats["policy_loss"]
    got, expected = policy_state(with_old), policy_state(fresh_only)
    assert got.keys() == expected.keys() and any(k.endswith("exp_avg") for k in got)
    changed = [name for name in expected if not torch.equal(got[name], expected[name])]
    assert changed == []
    # the critic learned from the critic-only episodes: its parameters moved, and not as without them
    after, fresh_after = critic_state(with_old), critic_state(fresh_only)
    assert any(not torch.equal(a, b) for a, b in zip(after, critic_before))
    assert any(not torch.equal(a, b) for a, b in zip(after, fresh_after))


def steps_with_critic_only(cfg: LearnerSection, critic_path: str) -> torch.Tensor:
    """Every trained parameter (full, also where sharded) after a first step and a second with critic-only episodes."""
    from torch.distributed.tensor import DTensor

    trainer = Trainer(tiny_causal_lm(), cfg, critic_path=critic_path)
    trainer.step(synthetic_batch(FRESH, seed=1))
    batch = synthetic_batch(FRESH + CRITIC_ONLY, seed=5)
    batch.critic_only = np.array([False] * FRESH + [True] * CRITIC_ONLY)
    trainer.step(batch)
    full = [p.detach().full_tensor() if isinstance(p, DTensor) else p.detach() for p in trainer._params()]
    return torch.cat([p.reshape(-1) for p in full])


def rank_worker(rank: int, world: int, init_file: str, cfg: LearnerSection, out_dir: str, critic_path: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.save(steps_with_critic_only(cfg, critic_path), f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("parallel, mode", [("ddp", "shared"), ("fsdp2", "separate")])
def test_two_gloo_ranks_train_critic_only_episodes_as_one_rank_does(parallel, mode, tmp_path):
    """The critic-only pass reaches the critic's parameters alone, which DDP does not reduce by itself and FSDP2
    reduces in its backward: either way the two ranks end where one rank does (float summation order aside,
    tests/unit/test_learner_multirank.py's bound)."""
    import torch.multiprocessing as mp

    from tests.unit.test_learner_multirank import TOLERANCE

    cfg = LearnerSection(estimator="turn_gae", lr=1e-2, device="cpu", max_tokens_per_microbatch=40, parallel=parallel)
    cfg.critic.mode = mode
    critic_path = str(tmp_path / "critic")
    tiny_causal_lm(seed=1).save_pretrained(critic_path)
    one_rank = steps_with_critic_only(cfg, critic_path)
    mp.spawn(rank_worker, args=(2, str(tmp_path / "init"), cfg, str(tmp_path), critic_path), nprocs=2, join=True)
    r0, r1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert torch.equal(r0, r1)
    assert (r0 - one_rank).abs().max().item() < TOLERANCE
