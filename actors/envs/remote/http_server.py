"""Reference server for the HTTP environment protocol (HTTP_ENV.md): serves any registered environment.

`python -m turnstream.actors.envs.remote.http_server --port 8700`. `--delay-s` and `--fail-every` make it slow
or failing on purpose, for testing clients.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
from dataclasses import asdict

from aiohttp import web

from turnstream.actors.environment import Environment

from turnstream.actors.envs.registry import make_env


def make_app(*, delay_s: float = 0.0, fail_every: int = 0, max_envs: int = 4096) -> web.Application:
    envs: dict[str, Environment] = {}
    ids = itertools.count()
    steps = itertools.count(1)

    def error(status: int, message: str) -> web.Response:
        return web.json_response({"error": message}, status=status)

    async def body(request: web.Request) -> dict:
        try:
            data = await request.json()
        except ValueError:
            raise web.HTTPBadRequest(text='{"error": "body is not JSON"}', content_type="application/json")
        if not isinstance(data, dict):
            raise web.HTTPBadRequest(text='{"error": "body is not an object"}', content_type="application/json")
        return data

    @web.middleware
    async def slow(request, handler):
        if delay_s:
            await asyncio.sleep(delay_s)
        return await handler(request)

    async def health(request):
        return web.json_response({"ok": True, "envs": len(envs)})

    async def create(request):
        data = await body(request)
        if len(envs) >= max_envs:
            return error(503, f"server full ({max_envs} environments)")
        try:
            env = make_env(str(data.get("name")), **dict(data.get("args") or {}))
        except (KeyError, TypeError, ValueError) as exc:
            return error(400, f"cannot create environment: {exc}")
        env_id = f"e{next(ids)}"
        envs[env_id] = env
        return web.json_response({"env_id": env_id, "action_tokens": env.action_tokens,
                                  "max_action_tokens": env.max_action_tokens, "num_agents": env.num_agents})

    def lookup(request) -> Environment:
        env = envs.get(request.match_info["env_id"])
        if env is None:
            raise web.HTTPNotFound(text='{"error": "unknown env_id"}', content_type="application/json")
        return env

    async def reset(request):
        env, data = lookup(request), await body(request)
        r = await env.reset(int(data.get("seed", 0)))
        return web.json_response(asdict(r))

    async def step(request):
        env, data = lookup(request), await body(request)
        if fail_every and next(steps) % fail_every == 0:
            return error(500, "injected failure")
        s = await env.step(str(data.get("action", "")))
        reply = asdict(s)
        if s.rewards is not None:
            reply["rewards"] = {str(k): v for k, v in s.rewards.items()}
        return web.json_response(reply)

    async def close(request):
        env = envs.pop(request.match_info["env_id"], None)
        if env is None:
            return error(404, "unknown env_id")
        await env.close()
        return web.json_response({})

    app = web.Application(middlewares=[slow])
    app.add_routes([web.get("/health", health), web.post("/envs", create),
                    web.post("/envs/{env_id}/reset", reset), web.post("/envs/{env_id}/step", step),
                    web.delete("/envs/{env_id}", close)])
    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8700)
    p.add_argument("--delay-s", type=float, default=0.0, help="sleep this long before every reply")
    p.add_argument("--fail-every", type=int, default=0, help="answer every Nth step with HTTP 500")
    a = p.parse_args(argv)
    web.run_app(make_app(delay_s=a.delay_s, fail_every=a.fail_every), host=a.host, port=a.port,
                print=lambda *_: None)


if __name__ == "__main__":
    main()
