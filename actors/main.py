"""`turnstream actor`: one actor process."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Awaitable, Callable

from turnstream.core.config import Config
from turnstream.core.urls_file import read_urls_file, watch_urls_file

log = logging.getLogger("turnstream.actor")


async def serve(cfg: Config, actor_index: int) -> None:
    import zmq.asyncio

    from turnstream.actors.drain import DrainableTasks, drain
    from turnstream.actors.envs.guard.settings import GuardSettings
    from turnstream.actors.envs.remote.http_env import close_sessions
    from turnstream.actors.evaluation import evaluator_for
    from turnstream.actors.inference.chat_tokens import ChatTokens
    from turnstream.actors.inference.seeds import RequestSeeds
    from turnstream.actors.link import BufferLink
    from turnstream.actors.metrics import ActorMetrics
    from turnstream.actors.play.choose import player_for
    from turnstream.actors.play.context import Sampling
    from turnstream.actors.play.endpoint.address import EndpointAddress
    from turnstream.actors.play.runner import EpisodeRunner
    from turnstream.actors.tasks.curriculum import TrackerValues, follow_announcements
    from turnstream.actors.tasks.position import keep_saving, position_path, restore_position, save_position
    from turnstream.protocol.auth import keys_for
    from turnstream.protocol.role_process import RoleProcess, finish
    from turnstream.protocol.sockets import bind_address, subscriber

    a, net, v = cfg.actor, cfg.network, cfg.vllm
    actor_id = f"actor-{actor_index}"
    endpoint = EndpointAddress.for_actor(cfg, actor_index)  # a config error before anything starts
    epoch = time.time_ns() // 1_000_000  # a restarted actor gets a new epoch without any saved state
    metrics = ActorMetrics()
    ctx = zmq.asyncio.Context()
    link = BufferLink(ctx, bind_address(net.buffer_address, net.buffer_ingest_port), actor_id=actor_id, epoch=epoch,
                      slots=a.concurrent_episodes, max_unacked=a.max_unacked, resend_after_s=a.resend_after_s,
                      metrics=metrics, max_message_bytes=net.max_message_bytes, curve=keys_for(net))
    role = RoleProcess(metrics.registry, net.listen_host, a.metrics_port + actor_index if a.metrics_port else 0)
    chat = ChatTokens(cfg.model.path)
    # how every episode is played; with env.isolation = process, the environment worker processes start with the
    # first episode and stop when this function's event loop ends (a graceful stop too: after the drain)
    player = player_for(cfg.env.name, dict(cfg.env.args), GuardSettings.from_config(cfg.env))

    values = TrackerValues()  # the learner's SPO tracker, for tasks.order = spo
    source = _task_source(cfg, player, actor_index, epoch, values)
    tasks_in_play = DrainableTasks(source)  # what a graceful stop drains
    position = position_path(cfg.run.run_dir, actor_index) if cfg.tasks.order == "sequential" else None
    if position is not None and (at := restore_position(position, source)) is not None:
        log.info("%s: the task source goes on at draw %d (%s)", actor_id, at, position)

    fleet = _fleet(cfg, v.urls, metrics, learner_version=lambda: link.learner_version,
                   seeds=RequestSeeds(cfg.run.seed, actor_id, epoch, "policy"),
                   model=cfg.learner.lora.served_adapter() if cfg.learner.lora else None)
    # the fixed policy never moves: its servers stay at their version, which is always "fresh enough"
    frozen = _fleet(cfg, v.frozen_urls, metrics, learner_version=lambda: 0,
                    seeds=RequestSeeds(cfg.run.seed, actor_id, epoch, "frozen")) if a.frozen_agents else None
    async with role, fleet as client, (frozen or contextlib.nullcontext()) as frozen_client:
        log.info("%s (epoch %d): %d episodes generating, up to %d in flight, metrics port %d", actor_id, epoch,
                 a.concurrent_episodes, a.in_flight_cap(), role.metrics_port)
        runner = EpisodeRunner(actor_id=actor_id, epoch=epoch, player=player, chat=chat,
                               client=client, link=link, metrics=metrics, tasks=tasks_in_play,
                               sampling=Sampling.from_config(cfg),
                               frozen_clients={agent: frozen_client for agent in a.frozen_agents},
                               request_timeout_s=a.request_timeout_s,
                               endpoint=endpoint)
        tasks = [asyncio.create_task(link.run()),
                 asyncio.create_task(_play_then_idle(
                     _once_served(fleet, lambda: runner.run(a.concurrent_episodes, a.in_flight_cap(),
                                                            cfg.buffer.episode_timeout_s)), actor_id, tasks_in_play))]
        if cfg.tasks.order == "spo":
            announcements = subscriber(ctx, bind_address(net.learner_address, net.learner_pub_port), keys_for(net))
            tasks.append(asyncio.create_task(follow_announcements(announcements, values, metrics,
                                                                  net.max_message_bytes)))
        if cfg.tasks.eval_split:  # held-out tasks, played every tasks.eval_every versions, never streamed
            evaluator = evaluator_for(cfg, runner, player.startup_env(), actor_index)
            tasks.append(asyncio.create_task(_once_served(fleet, evaluator.run)))
        if position is not None:
            tasks.append(asyncio.create_task(keep_saving(position, source)))
        if v.urls_file:
            tasks.append(asyncio.create_task(watch_urls_file(Path(v.urls_file), fleet.set_urls,
                                                             v.health_interval_s)))
        if await role.until_stopped(tasks):
            # SIGTERM/SIGINT: a graceful stop; the link keeps delivering while the open episodes finish
            await drain(tasks_in_play, link, cfg.launch.drain_timeout_s, actor_id)
        try:
            await finish(tasks)
        finally:
            if position is not None:  # the episodes in flight are not played: the next incarnation plays them
                save_position(position, source)
            await close_sessions()
            ctx.destroy(linger=0)


def _task_source(cfg: Config, player, actor_index: int, epoch: int, values):
    """The actor's task source under [tasks]; the player's start-up environment answers the orders that ask
    for the task count."""
    from turnstream.actors.tasks.orders import make_order
    from turnstream.actors.tasks.source import TaskSource

    t = cfg.tasks
    order = make_order(t.order, env_factory=player.startup_env,
                       actor_seed=hash((cfg.run.seed, actor_index, epoch)) % 2**31, run_seed=cfg.run.seed,
                       epochs=t.epochs, shard=actor_index, num_shards=cfg.actor.num_processes, values=values,
                       spo_epsilon=t.spo_epsilon, eval_split=t.eval_split)
    return TaskSource(order, t.group_size)


def _fleet(cfg: Config, urls: list[str], metrics, *, learner_version: Callable[[], int], seeds,
           model: str | None = None):
    """An inference fleet over `urls` with the actor's request, retry, health and staleness settings, drawing its
    requests' sampling seeds from `seeds`."""
    from turnstream.actors.inference.fleet import InferenceFleet

    v = cfg.vllm
    return InferenceFleet(urls, timeout_s=cfg.actor.request_timeout_s, retries=v.retries,
                          health_interval_s=v.health_interval_s,
                          max_staleness=cfg.buffer.max_staleness, learner_version=learner_version, metrics=metrics,
                          model=model, seeds=seeds)


async def _once_served(fleet, play: Callable[[], Awaitable[None]]) -> None:
    """Play once a server serves what the actor samples from (InferenceFleet.until_serving)."""
    await fleet.until_serving()
    await play()


async def _play_then_idle(playing: Awaitable[None], actor_id: str, tasks_in_play) -> None:
    """Play until the task source runs out (tasks.epochs), then keep the process (and its link, which still
    delivers the last chunks) up until it is stopped."""
    await playing
    if not tasks_in_play.draining:
        log.info("%s: the task source ran out (tasks.epochs); no more episodes", actor_id)
    await asyncio.Event().wait()


def main(cfg: Config, actor_index: int) -> None:
    if not cfg.vllm.urls:
        from turnstream.core.configtools import ConfigError

        urls = read_urls_file(Path(cfg.vllm.urls_file)) if cfg.vllm.urls_file else None
        if not urls:
            raise ConfigError("vllm.urls: an actor needs at least one vLLM server URL (or a vllm.urls_file naming one)")
        cfg.vllm.urls = urls
    if cfg.tasks.order == "spo" and not cfg.network.learner_pub_port:
        from turnstream.core.configtools import ConfigError

        raise ConfigError("network.learner_pub_port: tasks.order = spo reads the learner's version announcements; "
                          "name the learner's PUB port (turnstream up picks one)")
    if cfg.actor.frozen_agents and not cfg.vllm.frozen_urls:
        from turnstream.core.configtools import ConfigError

        raise ConfigError("vllm.frozen_urls: actor.frozen_agents needs the servers of the fixed policy they play")
    asyncio.run(serve(cfg, actor_index))
