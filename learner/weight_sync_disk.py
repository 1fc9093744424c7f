"""The `disk` weight-sync backend: safetensors into a shared directory, then `reload_weights` on every server.

Per server, independently and in parallel: pause(keep) -> `/collective_rpc reload_weights(weights_path)` ->
`update_weight_version` -> resume. Works on CPU and across hosts that share the weights directory. `save`
writes the weights bucket by bucket (learner/weight_sync_buckets.py), one safetensors file each, so a sharded
learner's rank 0 holds one bucket of full tensors at a time; the push itself reads only files.
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path

import aiohttp

from turnstream.learner.weight_sync_base import WeightSync, post
from turnstream.learner.weight_sync_buckets import Bucket, WeightBuckets

MODEL_SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                    "chat_template.jinja", "special_tokens_map.json")


class DiskWeightSync(WeightSync):
    backend = "disk"

    def __init__(self, urls: list[str], weights_dir: str | Path, model_dir: str | Path, keep: int = 2,
                 timeout_s: float = 120.0):
        super().__init__(urls, timeout_s)
        self.dir = Path(weights_dir).resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.model_dir = Path(model_dir)
        self.keep = keep

    def save(self, weights: dict | WeightBuckets, version: int) -> Path:
        """Write a complete HF checkpoint directory atomically (tmp dir + rename): a state dict as one
        safetensors file, a WeightBuckets source one file per bucket as it is gathered (with its index)."""
        final = self.dir / f"v{version:06d}"
        tmp = self.dir / f".tmp-v{version:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name in MODEL_SIDE_FILES:
            if (self.model_dir / name).exists():
                shutil.copy2(self.model_dir / name, tmp / name)
        if isinstance(weights, WeightBuckets):
            try:
                write_shards(tmp, weights, len(weights.buckets))
            finally:
                weights.finish()  # a failed write still reads the rest: the other ranks gather with us
        else:
            write_shards(tmp, [list(weights.items())], 1)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        self._prune(version)
        return final

    def _prune(self, current: int) -> None:
        """Keep versions current-keep..current; also drops leftovers of an earlier run numbered above."""
        for path in self.dir.glob("v*"):
            try:
                v = int(path.name[1:])
            except ValueError:
                continue
            if not current - self.keep <= v <= current:
                shutil.rmtree(path, ignore_errors=True)

    async def _transfer(self, session: aiohttp.ClientSession, urls: list[str], path: Path, version: int) -> None:
        for url in urls:
            await post(session, f"{url}/collective_rpc",
                       {"method": "reload_weights", "kwargs": {"weights_path": str(path)}})
            await post(session, f"{url}/update_weight_version", {"new_version": str(version)})


def write_shards(directory: Path, buckets: Iterable[Bucket], count: int) -> None:
    """Hugging Face's safetensors layout, one file per bucket: model.safetensors for one, else
    model-0000i-of-0000n.safetensors and model.safetensors.index.json (which transformers and vLLM read)."""
    from safetensors.torch import save_file

    weight_map, total, i = {}, 0, 0
    for bucket in buckets:  # not enumerate(): its cached result tuple holds the last bucket during the next gather
        i += 1
        name = "model.safetensors" if count == 1 else f"model-{i:05d}-of-{count:05d}.safetensors"
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in bucket}
        save_file(tensors, str(directory / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        del tensors, bucket
    if count > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
