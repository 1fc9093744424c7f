"""The one place a weight-sync backend is chosen: by name (`vllm.weight_sync.backend`), or from a run's config."""
from __future__ import annotations

from pathlib import Path

from turnstream.learner.sync.base import WeightSync
from turnstream.learner.sync.disk import DiskWeightSync
from turnstream.learner.sync.lora import LoraAdapterSync
from turnstream.learner.sync.nccl import NcclWeightSync


def make_weight_sync(backend: str, urls: list[str], *, weights_dir: str | Path = "", model_dir: str | Path = "",
                     keep: int = 2, master_address: str = "", master_port: int = 0,
                     transport=None) -> WeightSync:
    """The backend named `backend` (`vllm.weight_sync.backend`)."""
    if backend == "disk":
        return DiskWeightSync(urls, weights_dir, model_dir, keep=keep)
    if backend == "nccl":
        return NcclWeightSync(urls, master_address=master_address, master_port=master_port, transport=transport)
    raise ValueError(f"vllm.weight_sync.backend: unknown backend {backend!r} (disk or nccl)")


def weight_sync_from_config(cfg, default_weights_dir: str | Path) -> WeightSync:
    """The backend a run's config asks for (`[vllm.weight_sync]`, and `[learner.lora]` pushing adapters)."""
    chosen = cfg.vllm.weight_sync  # its fields past `backend` are that backend's arguments
    lora = cfg.learner.lora
    if lora is not None and lora.push == "adapter":  # the adapters alone, whatever backend full weights use
        return LoraAdapterSync(cfg.vllm.urls, cfg.learner.weights_dir or default_weights_dir, lora, cfg.model.path,
                               keep=cfg.learner.keep_weight_versions)
    return make_weight_sync(chosen.backend, cfg.vllm.urls, weights_dir=cfg.learner.weights_dir or default_weights_dir,
                            model_dir=cfg.model.path, keep=cfg.learner.keep_weight_versions,
                            **chosen.model_dump(exclude={"backend"}))
