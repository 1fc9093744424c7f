"""The `http` environment: an adapter for environments served over the protocol in HTTP_ENV.md.

Every failure (timeout, connection, non-200 status, malformed reply) becomes an `EnvError` with a kind,
which the runner counts and answers by abandoning the episode; the actor keeps running.
"""
from __future__ import annotations

import asyncio

import aiohttp

from turnstream.actors.environment import EnvError, Environment, Reset, Step, register
from turnstream.actors.loop_shared import LoopShared

# One connection pool per event loop, shared by every episode of the actor.
_SESSIONS: "LoopShared[aiohttp.ClientSession]" = LoopShared("http-env-session", alive=lambda s: not s.closed,
                                                           close=aiohttp.ClientSession.close)


async def _new_session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))


async def close_sessions() -> None:
    s = _SESSIONS.pop()
    if s is not None:
        await s.close()


def _field(body: dict, name: str, kind, default=...):
    if name not in body or body[name] is None:
        if default is ...:
            raise EnvError(f"reply lacks {name!r}", "malformed")
        return default
    value = body[name]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise EnvError(f"reply field {name!r} is {type(value).__name__}, expected {kind.__name__}", "malformed")
    return value


@register("http")
class HttpEnvironment(Environment):
    def __init__(self, url: str, name: str, args: dict | None = None, timeout_s: float = 30.0):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"http env: url must start with http:// or https://, got {url!r}")
        self.url, self.name, self.args = url.rstrip("/"), name, dict(args or {})
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.env_id: str | None = None

    async def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        url = self.url + path
        try:
            session = await _SESSIONS.get(_new_session)
            async with session.request(method, url, json=body, timeout=self.timeout) as resp:
                if resp.status != 200:
                    raise EnvError(f"{method} {url}: HTTP {resp.status}: {(await resp.text())[:200]}",
                                   f"http_{resp.status}")
                reply = await resp.json(content_type=None)
        except asyncio.TimeoutError:
            raise EnvError(f"{method} {url}: no reply within {self.timeout.total}s", "timeout") from None
        except aiohttp.ClientResponseError as exc:
            raise EnvError(f"{method} {url}: {exc!r}", "malformed") from None
        except aiohttp.ClientError as exc:
            raise EnvError(f"{method} {url}: {exc!r}", "connection") from None
        except ValueError as exc:  # not JSON
            raise EnvError(f"{method} {url}: reply is not JSON: {exc}", "malformed") from None
        if not isinstance(reply, dict):
            raise EnvError(f"{method} {url}: reply is not a JSON object", "malformed")
        return reply

    async def reset(self, seed: int) -> Reset:
        if self.env_id is None:
            info = await self._call("POST", "/envs", {"name": self.name, "args": self.args})
            self.env_id = _field(info, "env_id", str)
            tokens = _field(info, "action_tokens", list, None)
            if tokens is not None and not all(isinstance(t, str) for t in tokens):
                raise EnvError("action_tokens must be strings", "malformed")
            self.action_tokens = tokens
            self.max_action_tokens = _field(info, "max_action_tokens", int, self.max_action_tokens)
            self.num_agents = _field(info, "num_agents", int, 1)
        body = await self._call("POST", f"/envs/{self.env_id}/reset", {"seed": int(seed)})
        return Reset(_field(body, "observation", str), _field(body, "prompt_key", str),
                     agent=_field(body, "agent", int, 0), system=_field(body, "system", str, None))

    async def step(self, action: str) -> Step:
        if self.env_id is None:
            raise EnvError("step before reset", "protocol")
        body = await self._call("POST", f"/envs/{self.env_id}/step", {"action": action})
        rewards = _field(body, "rewards", dict, None)
        try:
            rewards = {int(k): float(v) for k, v in rewards.items()} if rewards is not None else None
        except (TypeError, ValueError):
            raise EnvError("rewards must map agent ids to numbers", "malformed") from None
        return Step(_field(body, "observation", str), _field(body, "reward", float), _field(body, "done", bool),
                    truncated=_field(body, "truncated", bool, False), info=_field(body, "info", dict, None),
                    agent=_field(body, "agent", int, None), rewards=rewards)

    async def close(self) -> None:
        if self.env_id is not None:
            env_id, self.env_id = self.env_id, None
            try:
                await self._call("DELETE", f"/envs/{env_id}")
            except EnvError:
                pass  # the server is gone or forgot the instance; nothing left to free
