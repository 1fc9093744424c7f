"""The calls the weight sync makes to a vLLM server's HTTP routes and the one error they raise, shared by the
control flow (learner/sync/base.py), the backends and the push verification (learner/sync/verify.py); and the
error that stops the learner when verification leaves it no server."""
from __future__ import annotations

import asyncio

import aiohttp


class WeightSyncError(RuntimeError):
    pass


class FleetUnverified(RuntimeError):
    """No server of the fleet has verified the latest version after the checks allowed: a learner that waited
    would wait for ever (a synchronous one needs data from that version). Not a WeightSyncError, which a push
    survives: this one stops the learner, whose restart pushes and verifies its checkpoint anew."""


async def post(session: aiohttp.ClientSession, url: str, body: dict) -> dict:
    return await _json_reply(session.post(url, json=body), url)


async def get(session: aiohttp.ClientSession, url: str) -> dict:
    return await _json_reply(session.get(url), url)


async def _json_reply(request, url: str) -> dict:
    """The JSON body of a 200 answer to `request` (an aiohttp request not yet entered); WeightSyncError else."""
    try:
        async with request as resp:
            if resp.status != 200:
                raise WeightSyncError(f"{url}: HTTP {resp.status}: {(await resp.text())[:300]}")
            return await resp.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise WeightSyncError(f"{url}: {exc!r}") from None


async def healthy(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.get(f"{url}/health", timeout=aiohttp.ClientTimeout(total=5)) as resp:
            return resp.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return False
