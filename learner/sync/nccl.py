"""The `nccl` weight-sync backend: vLLM's native weight-transfer engine (GPU clusters).

One NCCL group holds the learner (rank 0) and every worker of every server (server k's workers at
`rank_offset_k`, after the workers of servers 0..k-1). Each push, over all servers at once:

    pause(mode=keep) -> /start_weight_update -> /update_weights (in flight) || broadcast from rank 0
    -> /finish_weight_update {"weight_version": v} -> resume (always, in finally)

The HTTP calls that meet the learner inside NCCL (`/init_weight_transfer_engine`, `/update_weights`) must
be in flight while the learner's side of the same collective runs, so the transport's blocking calls run
in a thread next to them. A collective cannot skip a member: when any server fails, the group is torn
down, and the next push (or `resync()`) builds a new group from the servers that answer, which is how a
server that was down comes back. The data plane is a `NcclTransport`, so the control flow is tested with
a fake one (tests/unit/test_weight_sync.py); the real one needs CUDA (see docs/weight_sync_gpu.md).
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from collections.abc import Iterable
from typing import Any, Protocol

import aiohttp

from turnstream.learner.sync.base import WeightSync
from turnstream.learner.sync.server_calls import WeightSyncError, get, healthy, post
from turnstream.learner.weights.buckets import WeightBuckets
from turnstream.learner.sync.verify import PushVerifier

log = logging.getLogger("turnstream.learner")


class NcclTransport(Protocol):
    def init_group(self, master_address: str, master_port: int, world_size: int) -> None:
        """Join the group as rank 0 (blocks until every worker has joined)."""

    def send(self, tensors: Iterable[tuple[str, Any]]) -> None:
        """Broadcast the tensors from rank 0, in order (blocks until sent); `tensors` is read lazily, bucket
        by bucket, so a sharded learner gathers each bucket just before it is sent."""

    def close(self) -> None:
        """Leave the group."""


@dataclass
class NcclPayload:
    version: int
    weights: WeightBuckets  # read during the push (learner/weights/buckets.py)

    def __str__(self) -> str:  # what the learner announces as the weights' location
        return f"nccl:v{self.version:06d}"


class VllmNcclTransport:
    """The real data plane, built on vLLM's own helpers (needs CUDA and the `vllm` package on the learner)."""

    def __init__(self, packed: bool = True, buffer_size_bytes: int = 1 << 30, num_buffers: int = 2):
        self.packed, self.buffer_size_bytes, self.num_buffers = packed, buffer_size_bytes, num_buffers
        self.group = None

    def init_group(self, master_address: str, master_port: int, world_size: int) -> None:
        import torch
        from vllm.distributed.weight_transfer.nccl_common import stateless_init_process_group

        self.group = stateless_init_process_group(master_address, master_port, 0, world_size,
                                                  torch.cuda.current_device())

    def send(self, tensors: Iterable[tuple[str, Any]]) -> None:
        import torch

        assert self.group is not None, "init_group first"
        tensors = ((n, t if t.is_cuda else t.to("cuda")) for n, t in tensors)  # a CPU learner's tensors too
        if self.packed:
            from vllm.distributed.weight_transfer.packed_tensor import packed_nccl_broadcast_producer

            packed_nccl_broadcast_producer(iterator=iter(tensors), group=self.group, src=0,
                                           post_iter_func=lambda item: item[1],
                                           buffer_size_bytes=self.buffer_size_bytes, num_buffers=self.num_buffers)
        else:
            stream = torch.cuda.current_stream()
            for _, t in tensors:
                self.group.broadcast(t.contiguous(), src=0, stream=stream)
        torch.cuda.synchronize()

    def close(self) -> None:
        self.group = None


class NcclWeightSync(WeightSync):
    backend = "nccl"

    def __init__(self, urls: list[str], *, master_address: str, master_port: int,
                 transport: NcclTransport | None = None, packed: bool = True, timeout_s: float = 300.0,
                 verifier: PushVerifier | None = None):
        super().__init__(urls, timeout_s, verifier)
        self.master_address, self.master_port, self.packed = master_address, master_port, packed
        self.transport: NcclTransport = transport or VllmNcclTransport(packed=packed)
        self.members: list[str] | None = None  # servers in the current group; None: no group
        self.groups_built = 0

    def save(self, weights: WeightBuckets, version: int) -> NcclPayload:
        # Nothing is written: the broadcast reads the learner's tensors during push(), before the next step.
        return NcclPayload(version, weights)

    async def _build_group(self, session: aiohttp.ClientSession, urls: list[str]) -> None:
        await self._teardown(session)
        sizes = await asyncio.gather(*(get(session, f"{u}/get_world_size?include_dp=true") for u in urls))
        offsets, rank = [], 1  # rank 0 is the learner
        for body in sizes:
            offsets.append(rank)
            rank += int(body["world_size"])
        world = rank
        infos = [{"master_address": self.master_address, "master_port": self.master_port, "rank_offset": off,
                  "world_size": world, "packed": self.packed} for off in offsets]
        await asyncio.gather(
            *(post(session, f"{u}/init_weight_transfer_engine", {"init_info": info}) for u, info in zip(urls, infos)),
            asyncio.to_thread(self.transport.init_group, self.master_address, self.master_port, world))
        self.members = list(urls)
        self.groups_built += 1
        log.info("weight sync: NCCL group of %d ranks over %d server(s)", world, len(urls))

    async def _teardown(self, session: aiohttp.ClientSession) -> None:
        if self.members is None:
            return
        members, self.members = self.members, None
        self.transport.close()
        await asyncio.gather(*(post(session, f"{u}/shutdown_weight_transfer_engine", {}) for u in members),
                             return_exceptions=True)  # a dead server has nothing to shut down

    async def _push_all(self, session, urls: list[str], payload: NcclPayload, version: int) -> dict[str, str]:
        if payload.weights.spent:  # a resync of sharded weights: their gathers were the last push's
            return {u: "sharded weights are gathered once, by a push: the next push brings it up" for u in urls}
        try:
            return await self._push_group(session, payload, version)
        finally:
            # a sharded source that a failure left unread is read to its end: the other ranks are gathering
            await asyncio.to_thread(payload.weights.finish)

    async def _push_group(self, session, payload: NcclPayload, version: int) -> dict[str, str]:
        # A collective: every server that answers takes part, whatever subset the caller asked for.
        alive_flags = await asyncio.gather(*(healthy(session, u) for u in self.urls))
        alive = [u for u, ok in zip(self.urls, alive_flags) if ok]
        failed = {u: "not answering /health" for u, ok in zip(self.urls, alive_flags) if not ok}
        if not alive:
            return failed
        try:
            if self.members != alive:
                await self._build_group(session, alive)
            await self._group_push(session, alive, payload, version)
        except Exception as exc:  # the group is unusable after any failure inside it
            await self._teardown(session)
            for u in alive:
                failed[u] = f"{exc}"
            return failed
        for u in alive:
            self.versions[u] = version
        return failed

    async def _group_push(self, session, urls: list[str], payload: NcclPayload, version: int) -> None:
        specs = payload.weights.specs  # known before any tensor is gathered
        update_info = {"names": [s.name for s in specs], "dtype_names": [str(s.dtype).split(".")[-1] for s in specs],
                       "shapes": [list(s.shape) for s in specs]}
        await self._pause(session, urls)
        try:
            await asyncio.gather(*(post(session, f"{u}/start_weight_update", {}) for u in urls))
            await asyncio.gather(*(post(session, f"{u}/update_weights", {"update_info": update_info}) for u in urls),
                                 asyncio.to_thread(self.transport.send, payload.weights.items()))
            await asyncio.gather(*(post(session, f"{u}/finish_weight_update", {"weight_version": str(version)})
                                   for u in urls))
        finally:
            await self._resume(session, urls)

    async def _transfer(self, session, urls, payload, version) -> None:  # pragma: no cover - group-wide only
        raise WeightSyncError("the nccl backend pushes to the whole group at once")
