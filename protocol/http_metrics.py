"""Every role serves /metrics (Prometheus text) and /healthz from its own small aiohttp app."""
from __future__ import annotations

from typing import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


async def start_metrics_server(registry: CollectorRegistry, host: str, port: int,
                               health: Callable[[], dict] | None = None) -> tuple[web.AppRunner, int]:
    """Start serving; returns the runner (to clean up) and the bound port (port 0 picks a free one)."""

    async def metrics(_request: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", **(health() if health else {})})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, bound
