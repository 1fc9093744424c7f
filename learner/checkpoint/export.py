"""`turnstream export CHECKPOINT DIR`: a plain Hugging Face directory (config, safetensors, tokenizer files) of the
policy in any learner checkpoint, for transformers, vLLM, or a new run's `model.path`.

A sharded checkpoint (learner/checkpoint/sharded.py) is read without a process group, bucket by bucket: only the
policy's tensors (`net.model.*`), each bucket loaded from the ranks' shard files, cast, written as one
safetensors file and dropped, so exporting holds one bucket in memory. A single-file checkpoint
(learner/checkpoint/single_file.py) already holds a Hugging Face directory under model/, which is re-written
the same way.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from turnstream.core.configtools import ConfigError
from turnstream.learner.checkpoint import layout, sharded
from turnstream.learner.device import model_dtype
from turnstream.learner.lora import merge
from turnstream.learner.weights.buckets import TensorSpec, plan
from turnstream.learner.weights.files import ST_DTYPES, write_shards

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve(path: str | Path) -> Path:
    """A checkpoint directory, or the latest one under a checkpoints/ or run directory."""
    path = Path(path)
    if (path / "trainer.pt").is_file():
        return path
    for root in (path, path / "checkpoints"):
        if (found := layout.latest(root)) is not None:
            return found
    raise ConfigError(f"export: {path} is not a learner checkpoint (no trainer.pt), nor a directory holding one")


def export(source: str | Path, out: str | Path, dtype: str = "auto", shard_mb: int = 2048) -> Path:
    """Write the policy of `source` to `out` in `dtype` (auto: the dtype in the checkpoint's config.json)."""
    ckpt, out = resolve(source), Path(out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"export: {out} exists and is not empty")
    if dtype != "auto" and dtype not in _DTYPES:
        raise ConfigError(f"export: unknown dtype {dtype!r} (auto, {', '.join(_DTYPES)})")
    target = model_dtype(ckpt / "model") if dtype == "auto" else _DTYPES[dtype]
    tmp = out.parent / f".tmp-{out.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    layout.copy_side_files(ckpt / "model", tmp)
    (tmp / "adapter_config.json").unlink(missing_ok=True)  # a LoRA checkpoint's: the export is plain weights
    tied = json.loads((tmp / "config.json").read_text()).get("tie_word_embeddings", False)
    read = _sharded_reader(ckpt) if sharded.is_sharded(ckpt) else _file_reader(ckpt / "model")
    read = _with_lora_merged(ckpt / "model", read)
    specs = [s for s in read.specs if not (tied and s.name == "lm_head.weight")]  # as save_pretrained drops it
    specs = [TensorSpec(s.name, s.shape, target if s.dtype.is_floating_point else s.dtype) for s in specs]
    buckets = plan(specs, shard_mb << 20)
    write_shards(tmp, ([(s.name, t.to(s.dtype)) for s, t in zip(bucket, read([s.name for s in bucket]))]
                       for bucket in buckets), len(buckets))
    _set_config_dtype(tmp / "config.json", target)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _set_config_dtype(path: Path, dtype: torch.dtype) -> None:
    config = json.loads(path.read_text())
    name = str(dtype).split(".")[-1]
    config["dtype"] = name
    if "torch_dtype" in config:
        config["torch_dtype"] = name
    path.write_text(json.dumps(config, indent=2) + "\n")


class _sharded_reader:
    """The policy's tensors of a dcp/ directory, a bucket at a time, read through torch.distributed.checkpoint."""

    def __init__(self, ckpt: Path):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        self.reader = dcp.FileSystemReader(str(ckpt / sharded.DCP_DIR))
        meta = self.reader.read_metadata().state_dict_metadata
        prefix = sharded.POLICY_PREFIX
        self.meta = {k[len(prefix):]: m for k, m in meta.items()
                     if k.startswith(prefix) and isinstance(m, TensorStorageMetadata)}
        self.specs = [TensorSpec(k, tuple(m.size), m.properties.dtype) for k, m in self.meta.items()]

    def __call__(self, names: list[str]) -> list[torch.Tensor]:
        import torch.distributed.checkpoint as dcp

        state = {sharded.POLICY_PREFIX + n: torch.empty(tuple(self.meta[n].size),
                                                               dtype=self.meta[n].properties.dtype) for n in names}
        dcp.load(state, storage_reader=self.reader, no_dist=True)  # one bucket: the shard files read once
        return list(state.values())


def _with_lora_merged(model_dir: Path, read):
    """`read` itself, or for a learner.lora checkpoint (its model/ holds the adapter) the base's tensors with
    each adapted layer's update merged in (learner/lora.py, merge)."""
    if (model_dir / "adapter_config.json").is_file():
        return _merged_lora_reader(model_dir)
    if any(".lora_A." in s.name for s in read.specs):
        raise ConfigError("export: a sharded LoRA checkpoint (learner.lora under fsdp2) is not exported yet; "
                          "resume it on one process with learner.parallel = \"ddp\" and export that checkpoint")
    return read


class _merged_lora_reader:
    """A LoRA checkpoint's policy as plain weights: the base (adapter_config.json's base_model_name_or_path,
    the run's model.path) plus (lora_alpha / r) B A on each adapted weight, under the base's names."""

    def __init__(self, model_dir: Path):
        config = json.loads((model_dir / "adapter_config.json").read_text())
        base = Path(config.get("base_model_name_or_path") or "")
        if not (base / "config.json").is_file():
            raise ConfigError(f"export: the LoRA checkpoint's base model {str(base)!r} (adapter_config.json "
                              "base_model_name_or_path, the run's model.path) is not there")
        self.scaling = config["lora_alpha"] / config["r"]
        self.base, self.adapter = _file_reader(base), _file_reader(model_dir)
        self.specs = self.base.specs

    def __call__(self, names: list[str]) -> list[torch.Tensor]:
        out = []
        for name, t in zip(names, self.base(names)):
            a = f"base_model.model.{name.removesuffix('.weight')}.lora_A.weight"
            if name.endswith(".weight") and a in self.adapter.files:
                t = merge(t, *self.adapter([a, a.replace(".lora_A.", ".lora_B.")]), self.scaling)
            out.append(t)
        return out


class _file_reader:
    """The tensors of a Hugging Face directory's safetensors files (memory-mapped)."""

    def __init__(self, model_dir: Path):
        from safetensors import safe_open

        self.files = {}
        for f in sorted(model_dir.glob("*.safetensors")):
            handle = safe_open(str(f), framework="pt")
            self.files.update(dict.fromkeys(handle.keys(), handle))
        if not self.files:
            raise ConfigError(f"export: {model_dir} holds no safetensors weights")
        self.specs = []
        for name, handle in self.files.items():
            piece = handle.get_slice(name)
            self.specs.append(TensorSpec(name, tuple(piece.get_shape()), _st_dtype(piece.get_dtype())))

    def __call__(self, names: list[str]) -> list[torch.Tensor]:
        return [self.files[n].get_tensor(n) for n in names]


_TORCH_DTYPES = {code: dtype for dtype, code in ST_DTYPES.items()}  # safetensors' dtype codes, read back


def _st_dtype(name: str) -> torch.dtype:
    return _TORCH_DTYPES[name]
