"""Bit-for-bit fingerprints of the learner: `python tests/learner_fingerprint.py OUT.json`.

For every configuration below, a fresh tiny model trains 3 steps on fixed synthetic batches with a fixed seed;
OUT.json maps the configuration's name to sha256 digests of its parameters, its optimizer state, the weights a
push would carry, the estimator's checkpoint state (SPO's tracker), and the step statistics (timings left out).
Two runs of the same code give the same file, so comparing the file written before a refactor with the one
written after it shows whether the refactor changed any arithmetic. One process covers the estimators,
micro-batching, packing, LoRA, the reference model and the critic modes; two gloo ranks (spawned) cover ddp and
fsdp2.
"""
from __future__ import annotations

import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

STEPS = 3
EPISODES = 12
BUDGET = 40  # tokens per micro-batch: the synthetic batches split into several
PUSH_BUCKET_BYTES = 4096  # several buckets for the tiny model

LORA = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}

# name: LearnerSection fields (critic.* and spo.* as dotted keys; "lora" a dict; "ref": a reference model)
ONE_RANK = {
    "spo_microbatches": {"estimator": "spo", "max_tokens_per_microbatch": BUDGET},
    "spo_updated_drift_sequence_norm": {"estimator": "spo", "spo.drift": "updated", "spo.normalize": "sequence"},
    "spo_packed": {"estimator": "spo", "max_tokens_per_microbatch": BUDGET, "pack_sequences": True},
    "spo_checkpointing_warmup": {"estimator": "spo", "max_tokens_per_microbatch": BUDGET,
                                 "activation_checkpointing": True, "warmup_steps": 2, "weight_decay": 0.01},
    "spo_kl_reference": {"estimator": "spo", "max_tokens_per_microbatch": BUDGET, "kl_coef": 0.1, "ref": True},
    "grpo_microbatches": {"estimator": "grpo", "max_tokens_per_microbatch": BUDGET},
    "grpo_mask_sequence": {"estimator": "grpo", "behaviour_weight_mode": "mask_sequence", "entropy_coef": 0.0},
    "rloo_seq_mean": {"estimator": "rloo", "max_tokens_per_microbatch": BUDGET, "loss_agg": "seq-mean-token-mean"},
    "gigpo_microbatches": {"estimator": "gigpo", "max_tokens_per_microbatch": BUDGET},
    "turn_gae_shared_batch_whiten": {"estimator": "turn_gae", "max_tokens_per_microbatch": BUDGET},
    "turn_gae_shared_microbatch_whiten": {"estimator": "turn_gae", "max_tokens_per_microbatch": BUDGET,
                                          "critic.whiten": "microbatch"},
    "turn_gae_separate": {"estimator": "turn_gae", "max_tokens_per_microbatch": BUDGET, "critic.mode": "separate"},
    "token_gae_one_microbatch": {"estimator": "token_gae"},
    "token_gae_epochs_minibatches_turn_ratio": {"estimator": "token_gae", "max_tokens_per_microbatch": BUDGET,
                                                "epochs": 2, "minibatches": 2, "critic.turn_ratio": True},
    "spo_lora_adapter": {"estimator": "spo", "max_tokens_per_microbatch": BUDGET, "lora": {**LORA, "push": "adapter"}},
    "turn_gae_lora_merged": {"estimator": "turn_gae", "max_tokens_per_microbatch": BUDGET,
                             "lora": {**LORA, "push": "merged"}},
}
TWO_RANKS = {
    "ddp_spo": {"estimator": "spo", "max_tokens_per_microbatch": BUDGET},
    "ddp_spo_one_microbatch": {"estimator": "spo"},  # rank 1 idles: zero loss, still in the reduction
    "ddp_turn_gae_separate": {"estimator": "turn_gae", "max_tokens_per_microbatch": BUDGET, "critic.mode": "separate"},
    "ddp_token_gae_microbatch_whiten": {"estimator": "token_gae", "max_tokens_per_microbatch": BUDGET,
                                        "critic.whiten": "microbatch"},
    "ddp_spo_lora": {"estimator": "spo", "max_tokens_per_microbatch": BUDGET, "lora": {**LORA, "push": "adapter"}},
    "fsdp2_spo": {"estimator": "spo", "max_tokens_per_microbatch": BUDGET, "parallel": "fsdp2"},
    "fsdp2_spo_one_microbatch": {"estimator": "spo", "parallel": "fsdp2"},  # rank 1 runs stand-ins
    "fsdp2_turn_gae_shared": {"estimator": "turn_gae", "max_tokens_per_microbatch": BUDGET, "parallel": "fsdp2"},
    "fsdp2_turn_gae_separate_microbatch_whiten": {"estimator": "turn_gae", "max_tokens_per_microbatch": BUDGET,
                                                  "parallel": "fsdp2", "critic.mode": "separate",
                                                  "critic.whiten": "microbatch"},
    "fsdp2_grpo_kl_reference_keep_gathered": {"estimator": "grpo", "max_tokens_per_microbatch": BUDGET,
                                              "parallel": "fsdp2", "kl_coef": 0.1, "ref": True,
                                              "reshard_after_forward": False},
    "fsdp2_spo_lora_merged": {"estimator": "spo", "max_tokens_per_microbatch": BUDGET, "parallel": "fsdp2",
                              "lora": {**LORA, "push": "merged"}},
}


def _config(fields: dict):
    from turnstream.core.config import LearnerSection
    from turnstream.core.config_lora import LoraSection

    top = {k: v for k, v in fields.items() if "." not in k and k not in ("ref", "lora")}
    cfg = LearnerSection(lr=1e-2, device="cpu", **top,
                         lora=LoraSection(**fields["lora"]) if "lora" in fields else None)
    for key, value in fields.items():
        if "." in key:
            section, name = key.split(".")
            setattr(getattr(cfg, section), name, value)
    return cfg


def _full(t):
    from torch.distributed.tensor import DTensor

    t = t.detach()
    return t.full_tensor() if isinstance(t, DTensor) else t


def _digest(named) -> str:
    """sha256 over (name, dtype, shape, bytes) of every tensor, in order (full tensors: a collective if sharded)."""
    import torch

    h = hashlib.sha256()
    for name, t in named:
        t = _full(t).cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _optimizer_tensors(trainer):
    names = {id(p): n for n, p in trainer.net.named_parameters()}
    for group in trainer.optimizer.param_groups:
        for p in group["params"]:
            for key, value in sorted(trainer.optimizer.state.get(p, {}).items()):
                yield f"{names[id(p)]}.{key}", value


def _push_tensors(trainer):
    """The weights a bf16 push would carry, bucket by bucket (every rank reads: gathers under fsdp2)."""
    import torch

    return trainer.weight_buckets(torch.bfloat16, PUSH_BUCKET_BYTES).items()


def fingerprint(name: str, fields: dict, critic_dir: str) -> dict:
    import torch

    from tests.learner_batches import synthetic_batch, tiny_causal_lm
    from turnstream.learner import lora
    from turnstream.learner.step.trainer import Trainer

    cfg = _config(fields)
    torch.manual_seed(0)
    model = tiny_causal_lm(seed=0)
    torch.manual_seed(1)  # LoRA's adapters draw from the global generator
    model = lora.attach(model, cfg.lora)
    ref = tiny_causal_lm(seed=0).eval().requires_grad_(False) if fields.get("ref") else None
    trainer = Trainer(model, cfg, seed=0, critic_path=critic_dir, ref_model=ref)
    stats = []
    for s in range(STEPS):
        out = trainer.step(synthetic_batch(EPISODES, group=4, seed=100 + s))
        stats.append({k: v for k, v in sorted(out.items()) if k not in ("step_s", "tokens_per_s")})
    return {"parameters": _digest(trainer.net.named_parameters()),
            "optimizer": _digest(_optimizer_tensors(trainer)),
            "push_bf16": _digest(_push_tensors(trainer)),
            "tracker": hashlib.sha256(json.dumps(trainer.estimator.state_dict(), sort_keys=True).encode()).hexdigest(),
            "stats": hashlib.sha256(json.dumps(stats, sort_keys=True).encode()).hexdigest(),
            "version": trainer.version}


def _rank(rank: int, world: int, init_file: str, critic_dir: str, out_file: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        results = {name: fingerprint(name, fields, critic_dir) for name, fields in TWO_RANKS.items()}
        if rank == 0:
            Path(out_file).write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def main(out: str) -> None:
    import torch
    import torch.multiprocessing as mp

    from tests.learner_batches import tiny_causal_lm

    torch.set_num_threads(1)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        critic_dir = str(Path(tmp) / "critic")
        tiny_causal_lm(seed=1).save_pretrained(critic_dir)
        results = {name: fingerprint(name, fields, critic_dir) for name, fields in ONE_RANK.items()}
        two = Path(tmp) / "two_ranks.json"
        mp.spawn(_rank, args=(2, str(Path(tmp) / "init"), critic_dir, str(two)), nprocs=2, join=True)
        results.update(json.loads(two.read_text()))
    Path(out).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print(f"{len(results)} configurations in {time.monotonic() - started:.0f} s -> {out}")


if __name__ == "__main__":
    main(sys.argv[1])
