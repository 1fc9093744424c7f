"""`turnstream bench lora-push`: bytes a LoRA push moves against a full push of the same model.

The model is built from `--model-config` alone (benchmarks/model_configs) on the meta device (shapes, no weights:
the bytes do not depend on the values, and a 1.5b model need not fit in memory) with `[learner.lora]`'s
adapters attached (`--rank`, `--target-modules`; the defaults are the config's). Both pushes are the
learner's own backends' files in a scratch directory, in the served dtype (`--dtype`; auto: the config's):
the full push as the disk backend lays out its file (every weight, a tied embedding once; the header and the
file's size, the data left sparse), the LoRA push written by the lora backend (the adapters alone, which is
all a server loads per version; the base never moves). The figure is the bytes of the weight files:
`lora_push_bytes_ratio` = LoRA push / full push. The ratio is a count of bytes, so it does not depend on the
machine; the LoRA save time is printed for scale only.
Prints a line per push and, last, one JSON line.
"""
from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

WEIGHT_SUFFIX = ".safetensors"


def parse_args(argv):
    from turnstream.core.config_lora import LoraSection

    defaults = LoraSection()
    p = argparse.ArgumentParser(prog="turnstream bench lora-push")
    p.add_argument("--model-config", default="0.5b", help="tiny, 0.5b, 1.5b (benchmarks/model_configs) or a .json path")
    p.add_argument("--rank", type=int, default=defaults.rank)
    p.add_argument("--alpha", type=float, default=defaults.alpha)
    p.add_argument("--target-modules", default=",".join(defaults.target_modules))
    p.add_argument("--dtype", default="auto", help="served dtype: auto (the config's), bfloat16, float16, float32")
    p.add_argument("--out", default="runs/bench-lora-push")
    return p.parse_args(argv)


def weight_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.iterdir() if f.name.endswith(WEIGHT_SUFFIX))


def measure(model_config, lora, dtype: str = "auto", out: str | Path = "runs/bench-lora-push") -> dict:
    """Both pushes of the `model_config` shapes (a benchmarks/model_configs name or path, or a transformers config,
    e.g. the shrunk shapes of `bench learner --parallel`) with `lora` (a LoraSection) attached; the bytes and
    the ratio (`lora_push_bytes_ratio`)."""
    import torch
    from transformers import AutoModelForCausalLM

    from benchmarks.learner_mfu import model_config as shapes_of
    from turnstream.learner import lora as lora_layers
    from turnstream.learner.weights.buckets import WeightBuckets
    from turnstream.learner.weights.files import lay_out_file, shard_names
    from turnstream.learner.sync.lora import LoraAdapterSync
    from turnstream.learner.weights.source import policy_tensors, push_source

    shapes = shapes_of(model_config) if isinstance(model_config, (str, Path)) else model_config
    served = getattr(torch, dtype) if dtype != "auto" else (shapes.torch_dtype or torch.float32)
    if isinstance(served, str):
        served = getattr(torch, served)
    with torch.device("meta"):  # shapes only: the bytes do not depend on the values
        model = AutoModelForCausalLM.from_config(shapes, dtype=torch.float32)
    params = sum(p.numel() for p in model.parameters())
    out = Path(out)
    shutil.rmtree(out, ignore_errors=True)
    nowhere = ["http://127.0.0.1:9"]  # saves only: nothing is pushed to a server

    # The full push's file (every weight, a tied one once) laid out by the disk backend: its header, the data
    # left sparse. In name order, as safetensors writes tensors of one dtype: the header's length depends on the
    # order (the offsets' digits), and so the file is byte for byte as long as an unsharded push's.
    (out / "full").mkdir(parents=True)
    specs = sorted(WeightBuckets(policy_tensors(model), served).specs, key=lambda spec: spec.name)
    lay_out_file(out / "full" / shard_names(1)[0], specs)
    full_dir = out / "full"

    lora_layers.attach(model, lora)
    adapters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    # what the learner's push of the adapters carries (names, shapes, served dtypes), as zeros
    tensors = {s.name: torch.zeros(s.shape, dtype=s.dtype) for s in push_source(model, lora, served, 0).specs}
    sync = LoraAdapterSync(nowhere, out / "lora", lora, out)
    started = time.monotonic()
    lora_dir = sync.save(WeightBuckets(tensors, None), 1)  # small: written for real, by the backend a LoRA run pushes with
    lora_s = time.monotonic() - started

    full_bytes, lora_bytes = weight_bytes(full_dir), weight_bytes(lora_dir)
    shutil.rmtree(out, ignore_errors=True)
    return {"model_config": str(model_config if isinstance(model_config, (str, Path)) else shapes.model_type),
            "dtype": str(served).removeprefix("torch."), "rank": lora.rank,
            "target_modules": list(lora.target_modules), "params": params, "adapter_params": adapters,
            "full_push_bytes": full_bytes, "lora_push_bytes": lora_bytes, "lora_save_s": round(lora_s, 3),
            "lora_push_bytes_ratio": lora_bytes / full_bytes}


def main(argv: list[str]) -> int:
    from turnstream.core.config_lora import LoraSection

    args = parse_args(argv)
    lora = LoraSection(rank=args.rank, alpha=args.alpha, target_modules=args.target_modules.split(","))
    r = measure(args.model_config, lora, args.dtype, args.out)
    print(f"full push (baseline): {r['full_push_bytes'] / 2**20:.1f} MiB of {r['dtype']} weights, "
          f"{r['params'] / 1e6:.0f}M parameters")
    print(f"LoRA push, rank {r['rank']} on {len(r['target_modules'])} module kinds: "
          f"{r['lora_push_bytes'] / 2**20:.2f} MiB, {r['adapter_params'] / 1e6:.2f}M adapter parameters, "
          f"saved in {r['lora_save_s']:.2f} s")
    print(f"lora_push_bytes_ratio {r['lora_push_bytes_ratio']:.4f}")
    print(json.dumps(r))
    return 0
