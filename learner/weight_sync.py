"""Push weights into running vLLM servers without stopping generation (the `disk` backend).

Per push, on every server in parallel: pause(mode=keep, clear_cache=false) -> collective_rpc
reload_weights(weights_path) -> update_weight_version -> resume (always, in `finally`). Running requests
stay in flight and continue on the new weights; vLLM's per-token version spans record the switch.
"""
from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import aiohttp

MODEL_SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                    "chat_template.jinja", "special_tokens_map.json")


class WeightSyncError(RuntimeError):
    pass


class DiskWeightSync:
    def __init__(self, urls: list[str], weights_dir: str | Path, model_dir: str | Path, keep: int = 2,
                 timeout_s: float = 120.0):
        self.urls = urls
        self.dir = Path(weights_dir).resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.model_dir = Path(model_dir)
        self.keep = keep
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    def save(self, state_dict: dict, version: int) -> Path:
        """Write a complete HF checkpoint directory atomically (tmp dir + rename)."""
        from safetensors.torch import save_file

        final = self.dir / f"v{version:06d}"
        tmp = self.dir / f".tmp-v{version:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name in MODEL_SIDE_FILES:
            if (self.model_dir / name).exists():
                shutil.copy2(self.model_dir / name, tmp / name)
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
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

    async def push(self, path: Path, version: int) -> float:
        started = time.monotonic()
        async with aiohttp.ClientSession(timeout=self.timeout) as session:
            await asyncio.gather(*(self._push_one(session, url, path, version) for url in self.urls))
        return time.monotonic() - started

    async def set_version(self, version: int) -> None:
        async with aiohttp.ClientSession(timeout=self.timeout) as session:
            await asyncio.gather(*(_post(session, f"{u}/update_weight_version", {"new_version": str(version)})
                                   for u in self.urls))

    async def _push_one(self, session, url: str, path: Path, version: int) -> None:
        await _post(session, f"{url}/pause?mode=keep&clear_cache=false", {})
        try:
            await _post(session, f"{url}/collective_rpc",
                        {"method": "reload_weights", "kwargs": {"weights_path": str(path)}})
            await _post(session, f"{url}/update_weight_version", {"new_version": str(version)})
        finally:
            await _post(session, f"{url}/resume", {})


async def _post(session: aiohttp.ClientSession, url: str, body: dict) -> dict:
    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                raise WeightSyncError(f"{url}: HTTP {resp.status}: {(await resp.text())[:300]}")
            return await resp.json()
    except aiohttp.ClientError as exc:
        raise WeightSyncError(f"{url}: {exc!r}") from None
