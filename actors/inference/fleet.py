"""A fleet of vLLM servers behind one `generate()`: least outstanding requests, health checks, retries.

- Each request goes to the usable server with the fewest requests in flight from this actor (ties rotate),
  which keeps a slow or busy server from collecting a queue while others idle.
- A server that fails a request (connection refused or dropped, 5xx, timeout, malformed reply) is marked
  down at once and the request is retried on another server: no token of the failed attempt is used, so a
  retried turn is as exact as any other. A 4xx is the request's fault and is not retried.
- Every `health_interval_s` the fleet asks each server `/health` and `/weight_info` (and, when sampling from
  a LoRA adapter, `/v1/models`). A server comes back when it answers again (and lists the adapter); a
  server whose weights are more than `max_staleness` versions behind the learner (e.g. it was down during a
  push and has not been re-synced yet) gets no requests, since its tokens would be dropped as stale anyway.
- Servers can be added and removed while running (`set_urls`); a removed server drains: it gets no new
  requests and its in-flight requests finish.
- Busy time per server is the union of the intervals during which at least one request from this actor is
  outstanding, accrued exactly at every request start and end (and at each health check, so a long busy
  stretch shows before it ends). A sampled gauge misses requests that last milliseconds.
When no server is usable, `generate` waits up to `wait_for_server_s` for one before giving up.
Every request carries a sampling seed of its own (actors/inference/seeds.py), the same on each retry, and its
Generation says which, so that the turn can be sampled again (turnstream regenerate).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass
from typing import Callable

import aiohttp

from turnstream.actors.inference.client import (Generation, InferenceError, ServerFailure, StaleConnection,
                                                parse_version, post_generate)
from turnstream.actors.inference.seeds import RequestSeeds
from turnstream.actors.metrics import ActorMetrics
from turnstream.protocol.http_links import silent_peer_connector

log = logging.getLogger("turnstream.actor")


@dataclass
class Server:
    url: str
    outstanding: int = 0
    healthy: bool = True  # optimistic until a request or a health check fails
    version: int | None = None  # served weight version, from /weight_info or the last reply
    draining: bool = False
    failures: int = 0
    check_failures: int = 0  # health checks failed in a row
    last_error: str = ""
    busy_s: float = 0.0  # seconds with outstanding > 0, accrued up to busy_mark
    busy_mark: float = 0.0

    def accrue(self, now: float) -> float:
        """Adds the busy time since the last mark; returns it. Called at every change of `outstanding`, so
        overlapping requests are counted once (the union of their intervals, not the sum)."""
        added = max(0.0, now - self.busy_mark) if self.outstanding > 0 else 0.0
        self.busy_s += added
        self.busy_mark = now
        return added

    def begin(self, now: float) -> float:
        added = self.accrue(now)
        self.outstanding += 1
        return added

    def end(self, now: float) -> float:
        added = self.accrue(now)
        self.outstanding -= 1
        return added


class InferenceFleet:
    def __init__(self, urls: list[str], timeout_s: float = 60.0, *, retries: int = 2,
                 health_interval_s: float = 2.0, health_timeout_s: float = 5.0, wait_for_server_s: float = 10.0,
                 max_staleness: int | None = None, learner_version: Callable[[], int] = lambda: 0,
                 metrics: ActorMetrics | None = None, clock: Callable[[], float] = time.monotonic,
                 model: str | None = None, seeds: RequestSeeds | None = None):
        if not urls:
            raise ValueError("no vLLM server URLs")
        self.servers: dict[str, Server] = {}
        self.retries, self.health_interval_s, self.wait_for_server_s = retries, health_interval_s, wait_for_server_s
        self.max_staleness, self.learner_version = max_staleness, learner_version
        self.m = metrics or ActorMetrics()
        self.clock = clock
        self.model = model  # the served LoRA adapter to sample from (learner.lora); None: the base model
        self.seeds = seeds or RequestSeeds.unpredictable()
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.health_timeout = aiohttp.ClientTimeout(total=health_timeout_s)
        self._rotation = itertools.count()
        self._changed = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None
        self._health_task: asyncio.Task | None = None
        self.set_urls(urls)

    # ---- lifecycle ---------------------------------------------------------------------------------

    async def __aenter__(self) -> "InferenceFleet":
        # Idle connections are dropped after 3 s, before uvicorn (vLLM's server) closes them at 5 s: reusing a
        # connection the server is closing fails the request with "Server disconnected". A server whose link
        # went silent fails its requests within seconds (protocol/http_links.py), not at their time limit.
        self._session = aiohttp.ClientSession(timeout=self.timeout,
                                              connector=silent_peer_connector(limit=0, keepalive_timeout=3.0))
        if self.health_interval_s > 0:
            self._health_task = asyncio.create_task(self._health_loop())
        return self

    async def __aexit__(self, *exc) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
        if self._session is not None:
            await self._session.close()

    # ---- membership --------------------------------------------------------------------------------

    def set_urls(self, urls: list[str]) -> None:
        """Make the fleet these servers: new ones join, missing ones drain and leave."""
        wanted = [u.rstrip("/") for u in urls]
        for url in wanted:
            s = self.servers.get(url)
            if s is None:
                self.servers[url] = Server(url)
                log.info("inference fleet: server %s added", url)
            elif s.draining:
                s.draining = False
        for url, s in list(self.servers.items()):
            if url not in wanted and not s.draining:
                s.draining = True
                log.info("inference fleet: server %s removed (draining %d requests)", url, s.outstanding)
        self._forget_drained()
        self._changed.set()

    def _forget_drained(self) -> None:
        for url, s in list(self.servers.items()):
            if s.draining and s.outstanding == 0:
                del self.servers[url]
                self.m.server_usable.labels(url).set(0)

    def usable(self, s: Server) -> bool:
        if not s.healthy or s.draining:
            return False
        if self.max_staleness is None or s.version is None:
            return True
        return self.learner_version() - s.version <= self.max_staleness

    # ---- requests ----------------------------------------------------------------------------------

    def _pick(self, exclude: set[str]) -> Server | None:
        candidates = [s for s in self.servers.values() if s.url not in exclude and self.usable(s)]
        if not candidates:
            return None
        low = min(s.outstanding for s in candidates)
        best = [s for s in candidates if s.outstanding == low]
        return best[next(self._rotation) % len(best)]

    async def _wait_for_server(self, exclude: set[str]) -> Server | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_for_server_s
        while (s := self._pick(exclude)) is None:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(remaining, max(self.health_interval_s, 0.1)))
            except asyncio.TimeoutError:
                pass
        return s

    async def generate(self, token_ids: list[int], *, max_tokens: int, temperature: float,
                       allowed_token_ids: list[int] | None = None, cache_salt: str | None = None,
                       extra_params: dict | None = None, top_p: float = 1.0, top_k: int = 0) -> Generation:
        """`extra_params`: more of vLLM's sampling parameters (stop strings, structured outputs), as given."""
        assert self._session is not None, "use `async with InferenceFleet(...)`"
        tried: set[str] = set()
        errors: list[str] = []
        seed = self.seeds.draw()
        for attempt in range(self.retries + 1):
            # the first attempt may wait for a server to come back; retries only go to other live servers
            s = await self._wait_for_server(tried) if attempt == 0 else self._pick(tried)
            if s is None:
                break
            if attempt:
                self.m.inference_retries.inc()
            tried.add(s.url)
            self._busy(s, s.begin(self.clock()))
            self.m.server_outstanding.labels(s.url).set(s.outstanding)
            try:
                request = dict(max_tokens=max_tokens, temperature=temperature,
                               allowed_token_ids=allowed_token_ids, cache_salt=cache_salt, extra_params=extra_params,
                               model=self.model, top_p=top_p, top_k=top_k, seed=seed)
                try:
                    gen = await post_generate(self._session, s.url, token_ids, **request)
                except StaleConnection:
                    # The server closed an idle keep-alive connection as we reused it; the pool now opens
                    # a fresh one. Only a second failure says something about the server.
                    self.m.inference_retries.inc()
                    gen = await post_generate(self._session, s.url, token_ids, **request)
            except ServerFailure as exc:
                self._mark_down(s, str(exc))
                errors.append(str(exc))
                continue
            finally:
                self._busy(s, s.end(self.clock()))
                self.m.server_outstanding.labels(s.url).set(s.outstanding)
                if s.draining:
                    self._forget_drained()
            if gen.versions:
                s.version = gen.versions[-1]  # the freshest word on what this server serves
            return gen
        raise InferenceError("no vLLM server could serve the request" + (f": {'; '.join(errors)}" if errors
                                                                          else " (none usable)"))

    def _busy(self, s: Server, added_s: float) -> None:
        if added_s > 0:
            self.m.server_busy_seconds.labels(s.url).inc(added_s)

    def accrue_busy(self) -> None:
        """Brings every server's busy counter up to now, also in the middle of a busy stretch."""
        now = self.clock()
        for s in list(self.servers.values()):
            self._busy(s, s.accrue(now))

    def _mark_down(self, s: Server, reason: str) -> None:
        if s.healthy:
            log.warning("inference fleet: server %s marked down: %s", s.url, reason)
        s.healthy, s.last_error = False, reason
        s.failures += 1
        self.m.server_failures.labels(s.url).inc()
        self.m.server_usable.labels(s.url).set(0)

    # ---- health ------------------------------------------------------------------------------------

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await self.check_health()

    async def check_health(self) -> None:
        self.accrue_busy()
        await asyncio.gather(*(self._check(s) for s in list(self.servers.values()) if not s.draining))
        self._changed.set()

    async def _check(self, s: Server) -> None:
        assert self._session is not None
        definite = False  # refused connection or a non-200 answer: down now; a slow answer: down if repeated
        try:
            async with self._session.get(s.url + "/health", timeout=self.health_timeout) as resp:
                ok = resp.status == 200
                if not ok:
                    definite, s.last_error = True, f"/health answered HTTP {resp.status}"
            if ok:
                async with self._session.get(s.url + "/weight_info", timeout=self.health_timeout) as resp:
                    if resp.status == 200:
                        label = str((await resp.json()).get("weight_version", ""))
                        try:
                            s.version = parse_version(label)
                        except InferenceError:
                            s.version = None  # a label we did not set: do not judge its staleness
            if ok and self.model:
                ok = await self._serves_adapter(s)
                definite = not ok
        except aiohttp.ClientConnectorError as exc:
            ok, definite, s.last_error = False, True, repr(exc)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            ok, s.last_error = False, repr(exc)
        s.check_failures = 0 if ok else s.check_failures + 1
        if ok and not s.healthy:
            log.info("inference fleet: server %s is back (version %s)", s.url, s.version)
            s.healthy = True
        elif not ok and s.healthy and (definite or s.check_failures >= 2):
            # one slow /health on a busy machine is not evidence enough to take a serving server out
            self._mark_down(s, s.last_error or "health check failed")
        self.m.server_usable.labels(s.url).set(1 if self.usable(s) else 0)

    async def _serves_adapter(self, s: Server) -> bool:
        """Whether the server lists the adapter in /v1/models. A restarted server answers /health before the
        learner's re-sync loads the adapter into it; counting it healthy then would send it requests that 404
        and mark it down again at every check."""
        async with self._session.get(s.url + "/v1/models", timeout=self.health_timeout) as resp:
            if resp.status != 200:
                s.last_error = f"/v1/models answered HTTP {resp.status}"
                return False
            payload = await resp.json()
        try:
            served = {card["id"] for card in payload["data"]}
        except (KeyError, TypeError):
            s.last_error = "/v1/models answered no model list"
            return False
        if self.model not in served:
            s.last_error = f"adapter {self.model!r} not loaded"
            return False
        return True
