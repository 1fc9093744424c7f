"""`turnstream actor`: one actor process."""
from __future__ import annotations

import asyncio
import logging
import signal
import time

from turnstream.config import Config

log = logging.getLogger("turnstream.actor")


async def serve(cfg: Config, actor_index: int) -> None:
    import zmq.asyncio

    from actors.chat import ChatTokens
    from actors.env import make_env
    from actors.inference import VllmClient
    from actors.link import BufferLink
    from actors.metrics import ActorMetrics
    from actors.runner import EpisodeRunner, Sampling
    from protocol.http_metrics import start_metrics_server
    from protocol.sockets import bind_address

    a, net = cfg.actor, cfg.network
    actor_id = f"actor-{actor_index}"
    epoch = time.time_ns() // 1_000_000  # a restarted actor gets a new epoch without any saved state
    metrics = ActorMetrics()
    chat = ChatTokens(cfg.model.path)
    ctx = zmq.asyncio.Context()
    link = BufferLink(ctx, bind_address(net.host, net.buffer_ingest_port), actor_id=actor_id, epoch=epoch,
                      slots=a.concurrent_episodes, max_unacked=a.max_unacked, resend_after_s=a.resend_after_s,
                      metrics=metrics, max_message_bytes=net.max_message_bytes)
    metrics_port = a.metrics_port + actor_index if a.metrics_port else 0
    runner_http, port = await start_metrics_server(metrics.registry, net.host, metrics_port)
    log.info("%s (epoch %d): %d episodes in flight, metrics port %d", actor_id, epoch, a.concurrent_episodes, port)
    env_args = dict(cfg.env.args)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with VllmClient(cfg.vllm.urls, timeout_s=a.request_timeout_s) as client:
        runner = EpisodeRunner(actor_id=actor_id, epoch=epoch, env_factory=lambda: make_env(cfg.env.name, **env_args),
                               chat=chat, client=client, link=link,
                               sampling=Sampling(a.temperature, a.max_new_tokens, cfg.vllm.max_model_len),
                               metrics=metrics, seed=hash((cfg.run.seed, actor_index, epoch)) % 2**31)
        tasks = [asyncio.create_task(link.run()), asyncio.create_task(runner.run(a.concurrent_episodes))]
        stopper = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
        for t in [*tasks, stopper]:
            t.cancel()
    ctx.destroy(linger=0)
    await runner_http.cleanup()
    for t in done:
        if t is not stopper and not t.cancelled() and t.exception():
            raise t.exception()  # type: ignore[misc]


def main(cfg: Config, actor_index: int) -> None:
    if not cfg.vllm.urls:
        from turnstream.configtools import ConfigError

        raise ConfigError("vllm.urls: an actor needs at least one vLLM server URL")
    asyncio.run(serve(cfg, actor_index))
