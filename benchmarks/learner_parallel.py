"""`turnstream bench learner --parallel`: ddp against fsdp2 over `--ranks` gloo (or nccl) ranks under torchrun.

It launches `--ranks` real processes (torchrun, 127.0.0.1); each builds, for learner.parallel = ddp and fsdp2,
the `--model-config` shapes (benchmarks/model_configs; `--layers` and `--vocab` shrink them so that a CPU machine
fits them) with random weights, and times the real `Trainer.step` of both modes, alternated in the same
processes, on the synthetic multi-turn batch of benchmarks/learner_mfu.py. Reported per mode: the bytes one rank
holds of parameters, gradients and AdamW state (the fuller rank's; a sharded tensor counts its local shard),
step seconds and tokens/s; the tokens ratio is the median over step pairs. Then the push of the sharded
(fsdp2) policy with the disk backend's `save`, `--push-rounds` times: a safetensors file per bucket
(`--push-bucket-mb`, learner.push_bucket_mb) laid out by rank 0, every rank writing the rows of its shards
cast to `--push-dtype` into them, then every byte of those files read back, as a server's reload reads them; its
baseline is rank 0 writing the same number of bytes as one safetensors file and reading them back (bench
weight-sync's raw cost), alternated round by round. `push_ratio` = least push time / least raw time over the
rounds: on a shared machine other work only adds time, so the least of several rounds is the work's own cost
(as timeit takes it); the ratio of the medians is reported next to it. Prints a table, then one JSON line.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = ("ddp", "fsdp2")
TARGETS = {"fsdp2_state_bytes_ratio": 0.55, "fsdp2_tokens_ratio": 0.8, "push_ratio": 1.5}  # issue 26


def add_arguments(p) -> None:
    p.add_argument("--parallel", action="store_true", help="compare learner.parallel = ddp and fsdp2 over --ranks "
                   "torchrun ranks (uses --model-config, default 0.5b, --seq-len, --microbatches, --steps)")
    p.add_argument("--ranks", type=int, default=2, help="torchrun ranks (--parallel)")
    p.add_argument("--layers", type=int, default=0, help="keep only this many decoder layers of --model-config "
                   "(--parallel); 0: all")
    p.add_argument("--vocab", type=int, default=0, help="vocabulary size instead of --model-config's (--parallel); 0: "
                   "its own")
    p.add_argument("--push-bucket-mb", type=int, default=512, help="bucket of the sharded push (--parallel), MiB")
    p.add_argument("--push-dtype", default="bfloat16", help="dtype the push casts to (--parallel): the servers'")
    p.add_argument("--push-rounds", type=int, default=5, help="timed pushes and raw write+reads (--parallel)")
    p.add_argument("--keep-gathered", action="store_true", help="fsdp2 with learner.reshard_after_forward = false "
                   "(--parallel): a layer's gathered parameters stay until its backward")


def _spec(args) -> dict:
    return {"model_config": args.model_config or "0.5b", "layers": args.layers, "vocab": args.vocab,
            "seq_len": args.seq_len, "microbatches": args.microbatches, "group": args.group,
            "estimator": args.estimator, "steps": args.steps, "threads": args.threads, "seed": args.seed,
            "device": args.device, "precision": args.precision, "checkpointing": args.checkpointing,
            "push_bucket_mb": args.push_bucket_mb, "push_dtype": args.push_dtype, "push_rounds": args.push_rounds,
            "reshard_after_forward": not args.keep_gathered}


def _launch(spec: dict, ranks: int, out: Path) -> list[dict]:
    from turnstream.launch.processes import free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-addr",
           "127.0.0.1", "--master-port", str(free_port()), "-m", "benchmarks.learner_parallel",
           json.dumps(spec), str(out)]
    from benchmarks import child_env

    env = child_env(OMP_NUM_THREADS=str(spec["threads"]))  # torchrun would set 1 and warn
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"bench learner --parallel: the ranks failed:\n{proc.stderr[-4000:]}")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


def _shapes(spec: dict):
    """--model-config's transformers config, with --layers and --vocab applied."""
    from benchmarks.learner_mfu import model_config

    shapes = model_config(spec["model_config"])
    shapes.num_hidden_layers = spec["layers"] or shapes.num_hidden_layers
    shapes.vocab_size = spec["vocab"] or shapes.vocab_size
    return shapes


def _trainer(spec: dict, shapes, parallel: str):
    import torch
    from transformers import AutoModelForCausalLM

    from turnstream.core.config import LearnerSection
    from turnstream.learner.step.trainer import Trainer

    torch.manual_seed(spec["seed"])  # the same weights on every rank, and for both modes
    model = AutoModelForCausalLM.from_config(shapes, attn_implementation="sdpa", dtype=torch.float32)
    lc = LearnerSection(estimator=spec["estimator"], lr=1e-6, max_tokens_per_microbatch=spec["seq_len"],
                        pack_sequences=True, device=spec["device"], precision=spec["precision"],
                        activation_checkpointing=spec["checkpointing"], parallel=parallel,
                        reshard_after_forward=spec["reshard_after_forward"])
    return Trainer(model, lc, seed=spec["seed"])


def _rank(spec: dict, out: Path) -> None:
    """Both modes in the same processes, their steps alternated, so that both see the same machine load (on a
    shared machine the load moves more than the difference measured)."""
    import torch
    import torch.distributed as dist

    from benchmarks.learner_mfu import max_rss, synthetic_batch
    from turnstream.learner.parallel.ranks import init_from_env

    torch.set_num_threads(spec["threads"])
    rank, world = init_from_env(spec["device"])
    shapes = _shapes(spec)
    trainers = {mode: _trainer(spec, shapes, mode) for mode in MODES}
    batch = synthetic_batch(shapes.vocab_size, spec["seq_len"], spec["microbatches"], spec["group"], spec["seed"])
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for i in range(spec["steps"] + 1):  # the first round warms up (allocator, first gathers)
        for mode, trainer in trainers.items():
            dist.barrier()  # each step starts together: the time is the slower rank's
            started = time.perf_counter()
            trainer.step(batch)
            if i:
                times[mode].append(time.perf_counter() - started)
    result = {"rank": rank, "world": world, "tokens": int(batch.tokens.size), "max_rss_bytes": max_rss(),
              "params": sum(p.numel() for p in trainers["ddp"].model.parameters()), "times": times}
    for mode, trainer in trainers.items():  # gradients of the last update are still held
        result[mode] = state_bytes(trainer.optimizer)
    result.update(_pushes(trainers["fsdp2"], spec, out, rank))
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def state_bytes(optimizer) -> dict[str, int]:
    """Bytes this rank holds of the parameters the optimizer updates, their gradients and the optimizer's state
    (a shard's local part only)."""
    import torch
    from torch.distributed.tensor import DTensor

    def local(t) -> int:
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    params = [p for group in optimizer.param_groups for p in group["params"]]
    out = {"params": sum(local(p) for p in params),
           "grads": sum(local(p.grad) for p in params if p.grad is not None),
           "optimizer": sum(local(v) for s in optimizer.state.values() for v in s.values()
                            if isinstance(v, torch.Tensor))}
    out["total"] = sum(out.values())
    return out


def _pushes(trainer, spec: dict, out: Path, rank: int) -> dict:
    """Seconds of each sharded push (rank 0's: gathered, written, read back) and of each raw write + read."""
    import torch
    import torch.distributed as dist

    from benchmarks.weight_sync import raw_write_read
    from turnstream.learner.parallel.ranks import broadcast
    from turnstream.learner.sync.disk import DiskWeightSync
    from turnstream.learner.weights.files import write_files

    dtype, bucket = getattr(torch, spec["push_dtype"]), spec["push_bucket_mb"] << 20
    sync = DiskWeightSync([], out / "weights", out / "side-files") if rank == 0 else None
    times: dict[str, list[float]] = {"push": [], "raw": []}
    source = trainer.weight_buckets(dtype, bucket)
    raw = {"bytes": torch.ones(source.nbytes, dtype=torch.uint8)} if rank == 0 else None
    for version in range(spec["push_rounds"]):
        # rank 0 tells the others where to write their rows, as learner/rank_commands.py does in the learner
        announce = (lambda directory: broadcast(directory, 0, trainer.world)) if rank == 0 else None
        source = trainer.weight_buckets(dtype, bucket, announce)
        dist.barrier()
        started = time.perf_counter()
        if sync is not None:
            _read_every_byte(sync.save(source, version))
            times["push"].append(time.perf_counter() - started)
            times["raw"].append(raw_write_read(raw, out / "raw.safetensors"))
        else:
            write_files(broadcast(None, rank, trainer.world), source)  # the other ranks' rows
    return {"push_times": times, "push_bytes": source.nbytes, "push_buckets": len(source.buckets),
            "push_largest_bucket_bytes": max(sum(s.nbytes for s in b) for b in source.buckets)}


def _read_every_byte(directory: Path) -> None:
    for f in sorted(directory.glob("*.safetensors")):
        with f.open("rb") as fh:
            while fh.read(16 << 20):
                pass


def main(args) -> int:
    from benchmarks import lora_push
    from turnstream.core.config_lora import LoraSection

    spec = _spec(args)
    per_rank = _launch(spec, args.ranks, Path(tempfile.mkdtemp(prefix="bench-learner-parallel-")))
    r0, gib = per_rank[0], 2 ** 30
    tokens = r0["tokens"]
    state = {mode: max(r[mode]["total"] for r in per_rank) for mode in MODES}  # the fuller rank's
    step_s = {mode: statistics.median(r0["times"][mode]) for mode in MODES}
    pairs = [d / f for d, f in zip(r0["times"]["ddp"], r0["times"]["fsdp2"])]  # fsdp2 tokens/s over ddp's
    shape = ", ".join(f"{k} {spec[k]}" for k in ("layers", "vocab") if spec[k])
    print(f"{spec['model_config']} shapes{' (' + shape + ')' if shape else ''}: {r0['params'] / 1e6:.0f}M parameters, "
          f"{args.ranks} ranks, {tokens} tokens per step, {args.threads} thread(s) per rank, {args.steps} step pairs")
    print(f"{'mode':<8}{'state GiB/rank':>16}{'params':>9}{'grads':>9}{'adam':>9}{'step s':>9}{'tokens/s':>10}")
    for mode in MODES:
        parts = r0[mode]
        print(f"{mode:<8}{state[mode] / gib:>16.3f}{parts['params'] / gib:>9.3f}{parts['grads'] / gib:>9.3f}"
              f"{parts['optimizer'] / gib:>9.3f}{step_s[mode]:>9.2f}{tokens / step_s[mode]:>10.0f}")
    push_s, raw_s = (min(r0["push_times"][k]) for k in ("push", "raw"))
    push_median, raw_median = (statistics.median(r0["push_times"][k]) for k in ("push", "raw"))
    print(f"fsdp2 push of {r0['push_bytes'] / gib:.3f} GiB ({spec['push_dtype']}) in {r0['push_buckets']} bucket(s) "
          f"of at most {r0['push_largest_bucket_bytes'] / gib:.3f} GiB: {push_s:.3f} s (every rank writes its rows, "
          f"read back; median {push_median:.3f}); raw write + read of the same bytes {raw_s:.3f} s (median "
          f"{raw_median:.3f}); "
          f"least of {len(r0['push_times']['push'])} rounds; no rank keeps a full copy between pushes")
    lora = lora_push.measure(_shapes(spec), LoraSection(), dtype=spec["push_dtype"])  # the default adapters
    print(f"LoRA push (rank {lora['rank']}, {', '.join(lora['target_modules'])}): {lora['lora_push_bytes']} bytes "
          f"against {lora['full_push_bytes']} for the full weights")
    print(f"peak RSS of a rank (both modes built): {max(r['max_rss_bytes'] for r in per_rank) / gib:.2f} GiB")
    result = {"fsdp2_state_bytes_ratio": round(state["fsdp2"] / state["ddp"], 4),
              "fsdp2_tokens_ratio": round(statistics.median(pairs), 4), "push_ratio": round(push_s / raw_s, 4),
              "lora_push_bytes_ratio": round(lora["lora_push_bytes_ratio"], 4)}
    for key, target in TARGETS.items():
        word = "at least" if key == "fsdp2_tokens_ratio" else "at most"
        baseline = "raw write + read = 1" if key == "push_ratio" else "ddp = 1"
        print(f"{key} {result[key]} (baseline {baseline}; target {word} {target})")
    print(f"lora_push_bytes_ratio {result['lora_push_bytes_ratio']} (baseline a full push = 1)")
    result.update({f"{mode}_state_bytes_per_rank": state[mode] for mode in MODES})
    result.update({f"{mode}_tokens_per_s": round(tokens / step_s[mode], 2) for mode in MODES})
    result.update(push_s=round(push_s, 3), push_raw_s=round(raw_s, 3),
                  push_ratio_median=round(push_median / raw_median, 4),
                  push_rounds_s={k: [round(t, 3) for t in v] for k, v in r0["push_times"].items()},
                  push_bytes=r0["push_bytes"],
                  push_buckets=r0["push_buckets"], push_largest_bucket_bytes=r0["push_largest_bucket_bytes"],
                  push_bucket_mb=args.push_bucket_mb, params=r0["params"], tokens_per_step=tokens,
                  ranks=args.ranks, steps=args.steps, threads=args.threads, seq_len=args.seq_len, targets=TARGETS,
                  **{k: spec[k] for k in ("model_config", "layers", "vocab", "reshard_after_forward")})
    print(json.dumps(result))
    return 0


if __name__ == "__main__":  # one rank, under torchrun
    _rank(json.loads(sys.argv[1]), Path(sys.argv[2]))
