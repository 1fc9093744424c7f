"""Push weights into running vLLM servers without stopping generation: one interface, two backends.

Every push pauses the servers with `pause?mode=keep&clear_cache=false` (running requests stay in flight
and continue on the new weights; vLLM's per-token version spans record the switch), transfers, labels the
new version and resumes (always, in `finally`), on all servers in parallel. Backends differ only in the
transfer:
- `disk` (learner/weight_sync_disk.py): safetensors into a shared directory, then `/collective_rpc
  reload_weights`; works on CPU and across hosts with a shared filesystem.
- `nccl` (learner/weight_sync_nccl.py): vLLM's native weight-transfer engine, a broadcast from the learner
  (rank 0) to every server's workers.
With `[learner.lora]` pushing adapters, `lora` (learner/weight_sync_lora.py) loads the adapters alone into
every server as a LoRA adapter. The config's `[vllm.weight_sync]` table names the backend (`backend = "disk"` or `"nccl"` with `master_address`
and `master_port`); `weight_sync_from_config` builds it. The shared control flow is learner/weight_sync_base.py.

A server that fails during a push (down, restarting) is remembered as behind. Every push goes to every
server, so the next push brings it back; between pushes `resync()` (run by `watch()` in the background)
brings it to the latest version as soon as it answers `/health` again. Actors do not send it requests
while its version is outside the staleness bound (actors/fleet.py).

Interface used by learner/serve.py: `save(weights, version) -> path`, `await push(path, version)`,
`await set_version(version)`; `weights` is a state dict or, from the learner, a WeightBuckets source read
bucket by bucket (learner/weight_sync_buckets.py, learner.push_bucket_mb).
"""
from __future__ import annotations

from pathlib import Path

from turnstream.learner.weight_sync_base import WeightSync, WeightSyncError, post
from turnstream.learner.weight_sync_disk import MODEL_SIDE_FILES, DiskWeightSync
from turnstream.learner.weight_sync_lora import LoraAdapterSync
from turnstream.learner.weight_sync_nccl import NcclWeightSync


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
    """The backend a run's config asks for (`[vllm.weight_sync]`), for learner/main.py."""
    chosen = cfg.vllm.weight_sync  # its fields past `backend` are that backend's arguments
    lora = cfg.learner.lora
    if lora is not None and lora.push == "adapter":  # the adapters alone, whatever backend full weights use
        return LoraAdapterSync(cfg.vllm.urls, cfg.learner.weights_dir or default_weights_dir, lora, cfg.model.path,
                               keep=cfg.learner.keep_weight_versions)
    return make_weight_sync(chosen.backend, cfg.vllm.urls, weights_dir=cfg.learner.weights_dir or default_weights_dir,
                            model_dir=cfg.model.path, keep=cfg.learner.keep_weight_versions,
                            **chosen.model_dump(exclude={"backend"}))


__all__ = ["DiskWeightSync", "LoraAdapterSync", "MODEL_SIDE_FILES", "NcclWeightSync", "WeightSync", "WeightSyncError", "make_weight_sync",
           "post", "weight_sync_from_config"]
