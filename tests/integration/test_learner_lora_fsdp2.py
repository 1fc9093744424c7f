"""learner.lora under learner.parallel = "fsdp2" on 2 gloo ranks (torchrun, real processes) gives the one-rank
update, with activation checkpointing and with the shared value head; the base stays frozen in its shards,
and what a push carries (the adapters, or the merged weights, computed on the shards), read directly and
through the learner's own push path (rank 0's push_source, the other ranks following its order), equals the
one-rank push; a sharded checkpoint of the LoRA learner resumes to the same next step. This file is also the ranks' script (`python -m torch.distributed.run ... THIS_FILE OUT`)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-5  # float32 summation order of the reduce-scatter, as tests/integration/test_learner_fsdp2.py
STEPS = 2
# name: (estimator, micro-batch token budget, activation checkpointing)
CASES = {"spo_checkpointing": ("spo", 40, True), "turn_gae_shared_head": ("turn_gae", 40, False)}


def _lora(push: str = "adapter"):
    from turnstream.core.config_lora import LoraSection

    return LoraSection(rank=4, alpha=8.0, target_modules=["q_proj", "o_proj", "up_proj"], push=push)


def _train(name: str, parallel: str, steps: int = STEPS):
    from tests.learner_batches import synthetic_batch, tiny_causal_lm
    from turnstream.core.config import LearnerSection
    from turnstream.learner import lora
    from turnstream.learner.step.trainer import Trainer

    estimator, budget, checkpointing = CASES[name]
    cfg = LearnerSection(estimator=estimator, lr=1e-2, max_tokens_per_microbatch=budget, device="cpu",
                         activation_checkpointing=checkpointing, parallel=parallel, lora=_lora())
    cfg.critic.whiten = "batch"
    trainer = Trainer(lora.attach(tiny_causal_lm(seed=0), cfg.lora), cfg, seed=0)
    for s in range(steps):
        trainer.step(synthetic_batch(12, group=4, seed=100 + s))
    return trainer


def _resumed_step_difference(name: str, trainer, out: Path) -> float:
    """A sharded checkpoint (learner/checkpoint/sharded.py) of the LoRA learner, loaded by a fresh one: one more
    step on each gives the same weights (every rank calls this; rank 0's answer counts)."""
    import torch.distributed as dist

    from tests.learner_batches import synthetic_batch, tiny_causal_lm
    from turnstream.learner.checkpoint import store

    if dist.get_rank() == 0:
        tiny_causal_lm(seed=0).save_pretrained(out / "base")  # the side files a checkpoint copies
    dist.barrier()
    store.save(out / f"ckpt-{name}", trainer, out / "base", keep=2, tmp="tmp")
    dist.barrier()
    resumed = _train(name, "fsdp2", steps=0)
    store.restore(out / f"ckpt-{name}" / f"step-{STEPS:06d}", resumed)
    for t in (trainer, resumed):
        t.step(synthetic_batch(12, group=4, seed=100 + STEPS))
    went_on, came_back = _full(trainer.net.model.state_dict()), _full(resumed.net.model.state_dict())
    return max((went_on[k] - came_back[k]).abs().max().item() for k in went_on)


def _full(tensors: dict) -> dict[str, torch.Tensor]:
    """Full tensors of a state dict whose values may be shards (DTensor): a collective on every rank."""
    from torch.distributed.tensor import DTensor

    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone() for k, v in tensors.items()}


def _pushes(trainer) -> dict[str, dict[str, torch.Tensor]]:
    """The policy's weights and both kinds of push, computed from its (possibly sharded) state dict."""
    from turnstream.learner.weights.source import push_tensors

    state = trainer.net.model.state_dict()
    return {"weights": _full(state), "adapter": _full(push_tensors(state, _lora("adapter"))),
            "merged": _full(push_tensors(state, _lora("merged")))}


def _learner_pushes(trainer, out: Path) -> dict[str, dict[str, torch.Tensor]]:
    """Rank 0: both kinds of push through the learner's own path (rank_commands.push_source, which tells the
    other ranks to join, and follow() on them) into the backend each uses, read back from the files it wrote:
    the lora backend's adapter, the disk backend's merged weights; {} on the other ranks."""
    import torch.distributed as dist
    from safetensors.torch import load_file

    from turnstream.core.config import Config
    from turnstream.learner.parallel.ranks import broadcast
    from turnstream.learner.rank_commands import follow, push_source
    from turnstream.learner.sync.disk import DiskWeightSync
    from turnstream.learner.sync.lora import LoraAdapterSync

    pushed = {}
    for push in ("adapter", "merged"):
        trainer.cfg = trainer.cfg.model_copy(update={"lora": _lora(push)})
        cfg = Config(learner=trainer.cfg)
        if dist.get_rank() == 0:
            nowhere, weights = ["http://127.0.0.1:9"], out / f"weights-{push}"
            sync = (LoraAdapterSync(nowhere, weights, cfg.learner.lora, out) if push == "adapter"
                    else DiskWeightSync(nowhere, weights, out))
            path = sync.save(push_source(cfg, trainer, torch.float32), trainer.version)
            pushed[push] = {k: v for f in sorted(path.glob("*.safetensors")) for k, v in load_file(f).items()}
            broadcast(None, 0, trainer.world)  # follow() returns
        else:
            follow(cfg, trainer)
    return pushed


def _rank_main(out: Path) -> None:
    import torch.distributed as dist

    from turnstream.learner.parallel.fsdp2 import FullySharded

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        for name in CASES:
            trainer = _train(name, "fsdp2")
            assert isinstance(trainer.parallel, FullySharded)
            pushes = _pushes(trainer)  # every rank gathers
            learner = _learner_pushes(trainer, out / name)
            resumed = _resumed_step_difference(name, trainer, out)
            if dist.get_rank() == 0:
                torch.save({**pushes, **{f"learner_{k}": v for k, v in learner.items()}}, out / f"{name}.pt")
                (out / f"{name}-resumed.txt").write_text(f"{resumed}")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory):
    from tests.helpers import run_on_ranks

    out = tmp_path_factory.mktemp("lora-fsdp2")
    run_on_ranks(__file__, out)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_lora_fsdp2_two_ranks_match_one_rank(two_rank_results, name):
    from tests.learner_batches import tiny_causal_lm
    from turnstream.learner import lora

    one, two = _pushes(_train(name, "ddp")), torch.load(two_rank_results / f"{name}.pt")
    base = tiny_causal_lm(seed=0).state_dict()
    for kind in ("weights", "adapter", "merged", "learner_adapter", "learner_merged"):
        mine = one[kind.removeprefix("learner_")]
        assert mine.keys() == two[kind].keys(), kind
        diff = max((mine[k] - two[kind][k]).abs().max().item() for k in mine)
        print(f"{name}, {kind}: fsdp2 2 ranks vs 1 rank after {STEPS} steps: max |difference| {diff:.3g}")
        assert diff < TOLERANCE, kind
    weights = two["weights"]
    for k, v in weights.items():  # the base, sharded, never moved; the adapters did
        if lora.is_adapter(k):
            assert ".lora_A." in k or v.abs().max() > 1e-3, k
        else:
            assert torch.equal(v, base[k.replace(".base_layer.", ".")]), k
    assert max((two["merged"][k] - base[k]).abs().max().item() for k in base) > 1e-3


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    _rank_main(Path(sys.argv[1]))


@pytest.mark.parametrize("name", list(CASES))
def test_lora_fsdp2_resumes_from_its_sharded_checkpoint(two_rank_results, name):
    diff = float((two_rank_results / f"{name}-resumed.txt").read_text())
    print(f"{name}: LoRA fsdp2 resumed vs went on, one step later: max |difference| {diff:.3g}")
    assert diff < TOLERANCE
