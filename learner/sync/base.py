"""The weight-sync interface and what every backend shares: pause (keep) -> transfer -> label -> resume, on all
servers in parallel, and the bookkeeping of which server is behind (learner/sync/__init__.py explains the
whole; the backends, learner/sync/disk.py, nccl.py and lora.py, implement the transfer)."""
from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from turnstream.learner.sync.server_calls import FleetUnverified, WeightSyncError, healthy, post
from turnstream.protocol.http_links import silent_peer_connector

if TYPE_CHECKING:
    from turnstream.learner.sync.verify import Expected, PushVerifier
    from turnstream.learner.weights.buckets import WeightBuckets

log = logging.getLogger("turnstream.learner")


@dataclass(frozen=True)
class Latest:
    """The newest push, which `resync()` repeats: what save() returned, its version, and what a verified push's
    servers must serve (None: not verified)."""
    payload: Any
    version: int
    expected: Expected | None = None


class WeightSync(ABC):
    """The shared control flow; a backend implements `save` and `_transfer` (and may override `_push_all`).
    `verifier` checks that servers serve what a push carried (learner/sync/verify.py); None: never checked."""

    backend = ""

    def __init__(self, urls: list[str], timeout_s: float = 120.0, verifier: PushVerifier | None = None):
        self.urls = [u.rstrip("/") for u in urls]
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.verifier = verifier
        # last version pushed to each server (and, where verified, that it serves); None: behind, to resync
        self.versions: dict[str, int | None] = {u: None for u in self.urls}
        self.latest: Latest | None = None
        self.aborted_pauses = 0  # pauses that did not finish with a resume (should stay 0)
        self._one_push = asyncio.Lock()  # a resync never runs inside a push (nccl: one collective at a time)

    # ---- to implement ------------------------------------------------------------------------------

    @abstractmethod
    def save(self, weights: WeightBuckets, version: int) -> Any:
        """Make the weights ready to push (read bucket by bucket, learner/weights/buckets.py; a state dict is
        `WeightBuckets(state, None)`, one bucket as it is); returns what `push` takes, which the learner also
        announces as the weights' location."""

    @abstractmethod
    async def _transfer(self, session: aiohttp.ClientSession, urls: list[str], payload: Any, version: int) -> None:
        """Move the weights into the (already paused) servers `urls` and label them `version`."""

    # ---- membership --------------------------------------------------------------------------------

    def add_server(self, url: str) -> None:
        url = url.rstrip("/")
        if url not in self.versions:
            self.urls.append(url)
            self.versions[url] = None  # behind until the next push or resync

    def remove_server(self, url: str) -> None:
        url = url.rstrip("/")
        if url in self.versions:
            self.urls.remove(url)
            del self.versions[url]
            if self.verifier is not None:
                self.verifier.forget(url)

    def set_urls(self, urls: list[str]) -> None:
        """Follow a changed server list (core/urls_file.py): newcomers are behind until resynced."""
        wanted = [u.rstrip("/") for u in urls]
        for url in [u for u in self.urls if u not in wanted]:
            self.remove_server(url)
        for url in wanted:
            self.add_server(url)

    def behind(self) -> list[str]:
        if self.latest is None:
            return []
        return [u for u in self.urls if self.versions.get(u) != self.latest.version]

    def _session(self) -> aiohttp.ClientSession:
        """`timeout_s` bounds a whole push; a server whose link goes silent fails it within seconds
        (protocol/http_links.py), to be re-synced once it answers again (watch)."""
        return aiohttp.ClientSession(timeout=self.timeout, connector=silent_peer_connector())

    # ---- pushing -----------------------------------------------------------------------------------

    async def push(self, payload: Any, version: int, expected: Expected | None = None) -> float:
        """Push to every server in parallel, then, with `expected` (`verifier.expect`), verify that each serves
        it; raise WeightSyncError naming the servers that failed either."""
        started = time.monotonic()
        async with self._one_push, self._session() as session:
            self.latest = Latest(payload, version, expected)
            urls = list(self.urls)
            failed = await self._push_all(session, urls, payload, version)
            failed.update(await self._verify(session, [u for u in urls if u not in failed], expected))
        if failed:
            raise WeightSyncError(f"push of version {version} failed on {len(failed)} of {len(self.urls)} "
                                  f"server(s): " + "; ".join(f"{u}: {e}" for u, e in failed.items()))
        return time.monotonic() - started

    async def _push_all(self, session, urls: list[str], payload: Any, version: int) -> dict[str, str]:
        results = await asyncio.gather(*(self._push_one(session, u, payload, version) for u in urls),
                                       return_exceptions=True)
        return self._record(urls, results, version)

    def _record(self, urls: list[str], results: list, version: int) -> dict[str, str]:
        failed = {}
        for url, result in zip(urls, results):
            if isinstance(result, BaseException):
                failed[url] = str(result)
                log.warning("weight sync: %s missed version %d: %s", url, version, result)
            elif url in self.versions:
                self.versions[url] = version
        return failed

    async def _verify(self, session, urls: list[str], expected: Expected | None) -> dict[str, str]:
        """The servers in `urls` that do not serve `expected` are behind again: resync() pushes to them anew, and
        each push verifies them until one passes."""
        if expected is None or not urls:
            return {}
        assert self.verifier is not None, "an expected push needs the verifier that made it"
        failed = await self.verifier.verify(session, urls, expected)
        for url in failed:
            if url in self.versions:
                self.versions[url] = None
        self.verifier.give_up(self.urls, expected.version)
        return failed

    async def _push_one(self, session, url: str, payload: Any, version: int) -> None:
        await self._pause(session, [url])
        try:
            await self._transfer(session, [url], payload, version)
        finally:
            await self._resume(session, [url])

    async def _pause(self, session, urls: list[str]) -> None:
        # keep: in-flight requests are kept and continue on the new weights; clear_cache=false keeps their KV
        await asyncio.gather(*(post(session, f"{u}/pause?mode=keep&clear_cache=false", {}) for u in urls))

    async def _resume(self, session, urls: list[str]) -> None:
        results = await asyncio.gather(*(post(session, f"{u}/resume", {}) for u in urls), return_exceptions=True)
        for url, r in zip(urls, results):
            if isinstance(r, BaseException):
                self.aborted_pauses += 1  # a server we could not resume is down or restarting; resync fixes it
                log.warning("weight sync: resume of %s failed: %s", url, r)

    async def set_version(self, version: int) -> None:
        async with self._session() as session:
            await asyncio.gather(*(post(session, f"{u}/update_weight_version", {"new_version": str(version)})
                                   for u in self.urls))
        for u in self.urls:
            self.versions[u] = version

    # ---- re-sync -----------------------------------------------------------------------------------

    async def resync(self) -> list[str]:
        """Push the latest weights to every server that is behind and answers again; returns those synced."""
        if self._one_push.locked():  # a push is on its way to every server
            return []
        async with self._one_push, self._session() as session:
            stale = self.behind()
            if not stale or self.latest is None:
                return []
            latest = self.latest
            alive = [u for u, ok in zip(stale, await asyncio.gather(*(healthy(session, u) for u in stale))) if ok]
            if not alive:
                return []
            failed = await self._push_all(session, alive, latest.payload, latest.version)
            failed.update(await self._verify(session, [u for u in alive if u not in failed], latest.expected))
        version = latest.version
        synced = [u for u in alive if u not in failed]
        if synced:
            log.info("weight sync: re-synced %s to version %d", ", ".join(synced), version)
        return synced

    async def watch(self, interval_s: float = 5.0) -> None:
        """Background task: re-sync servers that come back between pushes."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.resync()
            except FleetUnverified:
                raise
            except Exception as exc:  # never let the watcher die; the next round tries again
                log.warning("weight sync: resync failed: %r", exc)
