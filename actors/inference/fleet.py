"""A fleet of vLLM servers behind one `generate()`: least outstanding requests, health checks, retries.

- Each request goes to the usable server with the fewest requests in flight from this actor (ties rotate),
  which keeps a slow or busy server from collecting a queue while others idle.
- A server that fails a request (connection refused, no route to host, reset or dropped, 5xx, malformed
  reply) is marked down at once and the request goes on to another usable server, up to `retries` others;
  no token of the failed attempt is used, so a retried turn is as exact as any other. A 4xx is the request's
  fault and is not retried.
- When those fail too, or none is usable, the request pauses (a back-off that doubles up to a cap, jittered:
  actors/inference/backoff.py) and tries again on any server that answers: a usable one, else one marked down
  (the request itself is the probe, health checks or not). Its episode and the episode's environment wait
  meanwhile. This goes on until the request's deadline, `timeout_s` (actor.request_timeout_s) from its first
  try, each try limited to the time left, so that an outage of every server shorter than the deadline costs
  the episode a wait and nothing else; past the deadline the request fails and its episode is abandoned.
- A server whose weights are more than `max_staleness` versions behind the learner version the actor knows
  (e.g. it was down during a push and has not been re-synced yet) gets no request, not even a retry: its tokens
  would be dropped as stale. An episode's older turns need no such check here: the buffer drops an episode
  whose oldest token passed the bound whether its request waited or not, and the wait is bounded by the deadline.
- Every `health_interval_s` the fleet asks each server `/health` and `/weight_info` (and, when sampling from
  a LoRA adapter, `/v1/models`). A server comes back when it answers again (and lists the adapter), or when it
  answers a request; a paused request resumes at once when a check takes a server back.
- Servers can be added and removed while running (`set_urls`); a removed server drains: it gets no new
  requests and its in-flight requests finish.
- Busy time per server is the union of the intervals during which at least one request from this actor is
  outstanding, accrued exactly at every request start and end (and at each health check, so a long busy
  stretch shows before it ends). A sampled gauge misses requests that last milliseconds.
Every request carries a sampling seed of its own (actors/inference/seeds.py), the same on each retry, and its
Generation says which, so that the turn can be sampled again (turnstream regenerate).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from dataclasses import dataclass
from typing import Callable

import aiohttp

from turnstream.actors.inference.backoff import RetryBackoff
from turnstream.actors.inference.client import (Generation, InferenceError, RequestTimedOut, ServerFailure,
                                                StaleConnection, parse_version, post_generate)
from turnstream.actors.inference.seeds import RequestSeeds
from turnstream.actors.metrics import ActorMetrics
from turnstream.protocol.http_links import silent_peer_connector

log = logging.getLogger("turnstream.actor")

# A request's pauses between rounds of failed tries. The first is short (a server restarting or a connection
# reset answers again within a second); the cap bounds how long after a server's return a paused request still
# sleeps, when no health check wakes it sooner, while a fleet of paused requests probes a lost server at most a
# few times a second.
RETRY_FIRST_DELAY_S = 0.25
RETRY_MAX_DELAY_S = 4.0
MAX_ERRORS_REPORTED = 3  # the last distinct errors a failed request's message names


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
                 health_interval_s: float = 2.0, health_timeout_s: float = 5.0,
                 max_staleness: int | None = None, learner_version: Callable[[], int] = lambda: 0,
                 metrics: ActorMetrics | None = None, clock: Callable[[], float] = time.monotonic,
                 model: str | None = None, seeds: RequestSeeds | None = None,
                 retry_first_delay_s: float = RETRY_FIRST_DELAY_S, retry_max_delay_s: float = RETRY_MAX_DELAY_S):
        """`timeout_s`: each request's deadline from its first try, its retries and pauses included."""
        if not urls:
            raise ValueError("no vLLM server URLs")
        self.servers: dict[str, Server] = {}
        self.timeout_s, self.retries, self.health_interval_s = timeout_s, retries, health_interval_s
        self.retry_first_delay_s, self.retry_max_delay_s = retry_first_delay_s, retry_max_delay_s
        self._jitter = random.Random()  # only spreads retries in time; no result depends on it
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
        self._serving: asyncio.Future | None = None  # until_serving's one wait
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
        for task in (self._health_task, self._serving):
            if task is not None:
                task.cancel()
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
        return s.healthy and self._worth_asking(s)

    def _worth_asking(self, s: Server) -> bool:
        """Not draining, and its weights within the staleness bound (as far as the actor knows them)."""
        if s.draining:
            return False
        if self.max_staleness is None or s.version is None:
            return True
        return self.learner_version() - s.version <= self.max_staleness

    # ---- requests ----------------------------------------------------------------------------------

    def _pick(self, exclude: set[str]) -> Server | None:
        return self._least_busy([s for s in self.servers.values() if s.url not in exclude and self.usable(s)])

    def _pick_down(self) -> Server | None:
        """A server marked down but otherwise worth asking: after a pause, the request probes it itself."""
        return self._least_busy([s for s in self.servers.values() if not s.healthy and self._worth_asking(s)])

    def _least_busy(self, candidates: list[Server]) -> Server | None:
        if not candidates:
            return None
        low = min(s.outstanding for s in candidates)
        best = [s for s in candidates if s.outstanding == low]
        return best[next(self._rotation) % len(best)]

    async def _pause(self, delay_s: float, deadline: float) -> None:
        """Sleep `delay_s` (not past `deadline`), or less when a health check or a change of membership makes
        a server usable meanwhile."""
        loop = asyncio.get_running_loop()
        until = min(loop.time() + delay_s, deadline)
        while (left := until - loop.time()) > 0:
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except asyncio.TimeoutError:
                return
            if self._pick(set()) is not None:
                return

    async def generate(self, token_ids: list[int], *, max_tokens: int, temperature: float,
                       allowed_token_ids: list[int] | None = None, cache_salt: str | None = None,
                       extra_params: dict | None = None, top_p: float = 1.0, top_k: int = 0) -> Generation:
        """`extra_params`: more of vLLM's sampling parameters (stop strings, structured outputs), as given.
        Raises InferenceError when the request is bad (a 4xx) or no server served it by its deadline."""
        assert self._session is not None, "use `async with InferenceFleet(...)`"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        request = dict(max_tokens=max_tokens, temperature=temperature, allowed_token_ids=allowed_token_ids,
                       cache_salt=cache_salt, extra_params=extra_params, model=self.model, top_p=top_p, top_k=top_k,
                       seed=self.seeds.draw())
        backoff = RetryBackoff(self.retry_first_delay_s, self.retry_max_delay_s, self._jitter)
        tried: set[str] = set()  # servers tried since the last pause
        errors: list[str] = []
        tries = 0
        while deadline - loop.time() > 0:
            s = self._pick(tried) if len(tried) <= self.retries else None
            if s is None:  # this round's servers failed, or none is usable: pause, then any server that answers
                await self._pause(backoff.next_delay(), deadline)
                tried.clear()
                s = self._pick(tried) or self._pick_down()
                if s is None or deadline - loop.time() <= 0:
                    continue  # every server draining or behind the staleness bound: wait on, up to the deadline
            if tries:
                self.m.inference_retries.inc()
            tries += 1
            tried.add(s.url)
            try:
                gen = await self._try(s, token_ids, request, deadline)
            except RequestTimedOut as exc:  # the deadline came while the server worked: no fault of the server
                errors.append(str(exc))
                break
            except ServerFailure as exc:
                self._mark_down(s, str(exc))
                errors.append(str(exc))
                continue
            if gen.versions:
                s.version = gen.versions[-1]  # the freshest word on what this server serves
            if not s.healthy:
                self._mark_up(s, "it answered a request")
            return gen
        self.m.inference_give_ups.inc()
        last = list(dict.fromkeys(reversed(errors)))[:MAX_ERRORS_REPORTED]
        raise InferenceError(f"no vLLM server could serve the request within actor.request_timeout_s "
                             f"({self.timeout_s:g} s, {tries} tries)"
                             + (f": {'; '.join(last)}" if last else ": none was usable (every server draining or "
                                "its weights more than max_staleness versions behind the learner)"))

    async def _try(self, s: Server, token_ids: list[int], request: dict, deadline: float) -> Generation:
        """One try on `s`, limited to the time left before `deadline`."""
        assert self._session is not None
        loop = asyncio.get_running_loop()
        self._busy(s, s.begin(self.clock()))
        self.m.server_outstanding.labels(s.url).set(s.outstanding)
        try:
            try:
                return await post_generate(self._session, s.url, token_ids, **request,
                                           timeout_s=self._time_left(s, deadline, loop))
            except StaleConnection:
                # The server closed an idle keep-alive connection as we reused it; the pool now opens
                # a fresh one. Only a second failure says something about the server.
                self.m.inference_retries.inc()
                return await post_generate(self._session, s.url, token_ids, **request,
                                           timeout_s=self._time_left(s, deadline, loop))
        finally:
            self._busy(s, s.end(self.clock()))
            self.m.server_outstanding.labels(s.url).set(s.outstanding)
            if s.draining:
                self._forget_drained()

    @staticmethod
    def _time_left(s: Server, deadline: float, loop: asyncio.AbstractEventLoop) -> float:
        left = deadline - loop.time()
        if left <= 0:  # aiohttp reads a time limit of 0 as none at all
            raise RequestTimedOut(f"{s.url}: the request's deadline passed before this try")
        return left

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

    def _mark_up(self, s: Server, reason: str) -> None:
        log.info("inference fleet: server %s is back (version %s): %s", s.url, s.version, reason)
        s.healthy, s.check_failures = True, 0
        self.m.server_usable.labels(s.url).set(1 if self.usable(s) else 0)
        self._changed.set()

    async def until_serving(self, poll_s: float = 1.0) -> None:
        """Return once some server serves the adapter the actor samples from (at once without one). A LoRA run's
        adapter exists only after the learner's first push, which follows its model load: episodes started
        before it would fail their requests until their time limit, and a held-out round at version 0 would
        score only the episodes that outlasted the wait. Every caller (the episode runner, the evaluator) shares
        one wait."""
        if not self.model:
            return
        if self._serving is None:
            self._serving = asyncio.ensure_future(self._wait_for_adapter(poll_s))
        await asyncio.shield(self._serving)

    async def _wait_for_adapter(self, poll_s: float) -> None:
        waited = 0.0
        while True:
            await self.check_health()
            if any(self.usable(s) for s in self.servers.values()):
                if waited:
                    log.info("inference fleet: adapter %r served after %.0f s", self.model, waited)
                return
            if waited == 0.0:
                log.info("inference fleet: waiting for a server to serve adapter %r (the learner's first push)",
                         self.model)
            await asyncio.sleep(poll_s)
            waited += poll_s

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
            self._mark_up(s, "its health check passed")
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
