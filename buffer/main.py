"""`turnstream buffer`: run the replay buffer process."""
from __future__ import annotations

import asyncio
import logging
import signal

from turnstream.config import Config

log = logging.getLogger("turnstream.buffer")


async def serve(cfg: Config) -> None:
    from buffer.metrics import BufferMetrics
    from buffer.server import BufferServer
    from buffer.store import ReplayStore
    from protocol.http_metrics import start_metrics_server
    from protocol.sockets import bind_address

    b, net = cfg.buffer, cfg.network
    metrics = BufferMetrics()
    store = ReplayStore(batch_episodes=b.batch_episodes, eta=b.eta, max_staleness=b.max_staleness,
                        max_running=b.max_running, max_items=b.max_items, episode_timeout_s=b.episode_timeout_s,
                        actor_timeout_s=b.actor_timeout_s, metrics=metrics)
    version_addr = bind_address(net.host, net.learner_pub_port) if net.learner_pub_port else None
    server = BufferServer(store, metrics, ingest_addr=bind_address(net.host, net.buffer_ingest_port),
                          serve_addr=bind_address(net.host, net.buffer_serve_port), version_addr=version_addr,
                          max_message_bytes=net.max_message_bytes)
    runner, port = await start_metrics_server(metrics.registry, net.host, b.metrics_port,
                                              health=lambda: {"learner_version": store.learner_version})
    log.info("buffer: ingest port %d, serve port %d, metrics port %d", server.ingest_port, server.serve_port, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    task = asyncio.create_task(server.run())
    await asyncio.wait([task, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
    task.cancel()
    server.close()
    await runner.cleanup()
    if task.done() and not task.cancelled() and task.exception():
        raise task.exception()  # type: ignore[misc]


def main(cfg: Config) -> None:
    asyncio.run(serve(cfg))
