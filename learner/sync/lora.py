"""The `lora` weight-sync backend: the trained adapters alone, loaded by every server as a LoRA adapter.

Chosen instead of `vllm.weight_sync.backend` when `[learner.lora]` pushes adapters (`push = "adapter"`).
`save` writes a PEFT adapter directory (adapter_config.json + adapter_model.safetensors, the adapters only:
the base never changes) atomically into the weights directory; per server, in parallel: pause(keep) ->
`POST /v1/load_lora_adapter {lora_name, lora_path, load_inplace: true}` -> `update_weight_version` ->
resume, the same control flow and version labels as the full-weight backends (learner/sync/base.py).
`load_inplace` replaces the adapter's weights under the name the actors ask for (`learner.lora.served_name`),
and loads it where the server does not hold it yet (a first push, a restarted server's re-sync).

The servers need vLLM's runtime adapter loading: `--enable-lora --max-lora-rank R` and
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=1` (turnstream/launch/vllm_server.py adds them when `[learner.lora]` is set). A
server without it answers 404 (no route) or 400; the push then fails with that hint, and
`learner.lora.push = "merged"` pushes full merged weights through the configured backend instead.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import torch

from turnstream.core.config_lora import LoraSection
from turnstream.learner.lora import ADAPTER_FILE, adapter_tensors, is_adapter, peft_config
from turnstream.learner.weights.buckets import WeightBuckets
from turnstream.learner.sync.disk import DiskWeightSync
from turnstream.learner.sync.server_calls import WeightSyncError, post
from turnstream.learner.sync.verify import PushVerifier

HINT = ("the server does not load LoRA adapters at run time (start vLLM with --enable-lora --max-lora-rank R and "
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1, or set learner.lora.push = \"merged\")")


class LoraAdapterSync(DiskWeightSync):
    """The disk backend's directory of versions (v000007, the newest `keep` kept), holding adapters."""

    backend = "lora"

    def __init__(self, urls: list[str], weights_dir: str | Path, lora: LoraSection, base_model: str | Path,
                 keep: int = 2, timeout_s: float = 120.0, verifier: PushVerifier | None = None):
        super().__init__(urls, weights_dir, base_model, keep=keep, timeout_s=timeout_s, verifier=verifier)
        self.lora = lora
        self.last_bytes = 0  # bytes of tensors in the last adapter saved (benchmarks/lora_push.py reads it)

    def save(self, weights: WeightBuckets, version: int) -> Path:
        """The adapter directory of `version`; `weights` holds the adapters, under the model's names or the PEFT
        file's, and possibly more, which is left out. Adapters are small: a sharded source's buckets are
        gathered whole before the file is written."""
        try:
            tensors = {name: t.detach() for name, t in weights.items()}
        finally:
            weights.finish()  # a sharded source: the other ranks gather with us to the end, whatever happens here
        if any(is_adapter(k) for k in tensors):
            tensors = adapter_tensors(tensors)
        if not tensors:
            raise ValueError("no LoRA adapter tensors to push (is [learner.lora] attached to the model?)")
        tmp = self._new_version_dir(version)
        adapter_files(tmp, tensors, self.lora, str(self.model_dir.resolve()))
        self.last_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
        return self._publish(tmp, version)

    async def _transfer(self, session: aiohttp.ClientSession, urls: list[str], path: Path, version: int) -> None:
        for url in urls:
            body = {"lora_name": self.lora.served_name, "lora_path": str(path), "load_inplace": True}
            await load_adapter(session, url, body)
            await post(session, f"{url}/update_weight_version", {"new_version": str(version)})


async def load_adapter(session: aiohttp.ClientSession, url: str, body: dict) -> None:
    """POST /v1/load_lora_adapter, which answers 200 with plain text; WeightSyncError (with the hint where the
    server seems not to load adapters) otherwise."""
    endpoint = f"{url}/v1/load_lora_adapter"
    try:
        async with session.post(endpoint, json=body) as resp:
            if resp.status != 200:
                hint = f" ({HINT})" if resp.status in (400, 404) else ""
                raise WeightSyncError(f"{endpoint}: HTTP {resp.status}: {(await resp.text())[:300]}{hint}")
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise WeightSyncError(f"{endpoint}: {exc!r}") from None


def adapter_files(directory: Path, tensors: dict[str, torch.Tensor], cfg: LoraSection, base_model: str) -> None:
    """A PEFT adapter directory (adapter_config.json, adapter_model.safetensors) that vLLM and peft load."""
    from safetensors.torch import save_file

    peft_config(cfg, str(base_model)).save_pretrained(str(directory))
    save_file({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, str(directory / ADAPTER_FILE),
              metadata={"format": "pt"})
