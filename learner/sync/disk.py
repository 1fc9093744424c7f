"""The `disk` weight-sync backend: safetensors into a shared directory, then `reload_weights` on every server.

Per server, independently and in parallel: pause(keep) -> `/collective_rpc reload_weights(weights_path)` ->
`update_weight_version` -> resume. Works on CPU and across hosts that share the weights directory. `save`
writes the weights bucket by bucket, one safetensors file each (learner/weights/files.py; under fsdp2 every
rank writes the rows of its own shards, nothing is gathered). The push itself reads only files.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import aiohttp

from turnstream.learner.sync.base import WeightSync
from turnstream.learner.sync.server_calls import post
from turnstream.learner.sync.verify import PushVerifier
from turnstream.learner.weights.buckets import WeightBuckets
from turnstream.learner.weights.files import write_files

MODEL_SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                    "chat_template.jinja", "special_tokens_map.json")


class DiskWeightSync(WeightSync):
    backend = "disk"

    def __init__(self, urls: list[str], weights_dir: str | Path, model_dir: str | Path, keep: int = 2,
                 timeout_s: float = 120.0, verifier: PushVerifier | None = None):
        super().__init__(urls, timeout_s, verifier)
        self.dir = Path(weights_dir).resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.model_dir = Path(model_dir)
        self.keep = keep

    def save(self, weights: WeightBuckets, version: int) -> Path:
        """Write a complete HF checkpoint directory atomically (tmp dir + rename): one safetensors file per
        bucket, with its index."""
        tmp = self._new_version_dir(version)
        for name in MODEL_SIDE_FILES:
            if (self.model_dir / name).exists():
                shutil.copy2(self.model_dir / name, tmp / name)
        write_files(tmp, weights)
        return self._publish(tmp, version)

    def _new_version_dir(self, version: int) -> Path:
        """An empty scratch directory for `version`'s files, which _publish renames into place."""
        tmp = self.dir / f".tmp-v{version:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        return tmp

    def _publish(self, tmp: Path, version: int) -> Path:
        """`tmp` becomes v<version> at once (a server never reads a half-written version); older ones pruned."""
        final = self.dir / f"v{version:06d}"
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
