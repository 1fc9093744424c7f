"""`turnstream actor`: one actor process."""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from pathlib import Path

from turnstream.core.config import Config
from turnstream.core.urls_file import read_urls_file, watch_urls_file

log = logging.getLogger("turnstream.actor")


async def serve(cfg: Config, actor_index: int) -> None:
    import zmq.asyncio

    from turnstream.actors.chat import ChatTokens
    from turnstream.actors.registry import make_env
    from turnstream.actors.envs.http_env import close_sessions
    from turnstream.actors.fleet import InferenceFleet
    from turnstream.actors.evaluation import evaluator_for
    from turnstream.actors.link import BufferLink
    from turnstream.actors.metrics import ActorMetrics
    from turnstream.actors.runner import EpisodeRunner, Sampling
    from turnstream.actors.curriculum import TrackerValues, follow_announcements
    from turnstream.actors.drain import DrainableTasks, drain
    from turnstream.actors.task_position import keep_saving, position_path, restore_position, save_position
    from turnstream.actors.tasks import TaskSource, make_order
    from turnstream.protocol.auth import keys_for
    from turnstream.protocol.role_process import RoleProcess, finish
    from turnstream.protocol.sockets import bind_address, subscriber

    a, net = cfg.actor, cfg.network
    actor_id = f"actor-{actor_index}"
    epoch = time.time_ns() // 1_000_000  # a restarted actor gets a new epoch without any saved state
    metrics = ActorMetrics()
    chat = ChatTokens(cfg.model.path)
    ctx = zmq.asyncio.Context()
    link = BufferLink(ctx, bind_address(net.buffer_address, net.buffer_ingest_port), actor_id=actor_id, epoch=epoch,
                      slots=a.concurrent_episodes, max_unacked=a.max_unacked, resend_after_s=a.resend_after_s,
                      metrics=metrics, max_message_bytes=net.max_message_bytes, curve=keys_for(net))
    role = RoleProcess(metrics.registry, net.listen_host, a.metrics_port + actor_index if a.metrics_port else 0)
    env_args = dict(cfg.env.args)
    v = cfg.vllm
    fleet = InferenceFleet(v.urls, timeout_s=a.request_timeout_s, retries=v.retries,
                           health_interval_s=v.health_interval_s, wait_for_server_s=v.wait_for_server_s,
                           max_staleness=cfg.buffer.max_staleness, learner_version=lambda: link.learner_version,
                           metrics=metrics, model=cfg.learner.lora.served_adapter() if cfg.learner.lora else None)
    # the fixed policy never moves: its servers stay at their version, which is always "fresh enough"
    frozen = InferenceFleet(v.frozen_urls, timeout_s=a.request_timeout_s, retries=v.retries,
                            health_interval_s=v.health_interval_s, wait_for_server_s=v.wait_for_server_s,
                            max_staleness=cfg.buffer.max_staleness, learner_version=lambda: 0,
                            metrics=metrics) if a.frozen_agents else None

    def env_factory():
        return make_env(cfg.env.name, **env_args)

    # one instance answers the start-up questions (task count, held-out split): building an environment can
    # load a dataset, and only the orders that enumerate need one at all
    startup_env = functools.cache(env_factory)

    values = TrackerValues()  # the learner's SPO tracker, for tasks.order = spo
    order = make_order(cfg.tasks.order, env_factory=startup_env,
                       actor_seed=hash((cfg.run.seed, actor_index, epoch)) % 2**31, run_seed=cfg.run.seed,
                       epochs=cfg.tasks.epochs, shard=actor_index, num_shards=a.num_processes, values=values,
                       spo_epsilon=cfg.tasks.spo_epsilon, eval_split=cfg.tasks.eval_split)
    source = TaskSource(order, cfg.tasks.group_size)
    tasks_in_play = DrainableTasks(source)  # what a graceful stop drains
    position = position_path(cfg.run.run_dir, actor_index) if cfg.tasks.order == "sequential" else None
    if position is not None and (at := restore_position(position, source)) is not None:
        log.info("%s: the task source goes on at draw %d (%s)", actor_id, at, position)
    async with role, fleet as client, (frozen or contextlib.nullcontext()) as frozen_client:
        log.info("%s (epoch %d): %d episodes in flight, metrics port %d", actor_id, epoch, a.concurrent_episodes,
                 role.metrics_port)
        runner = EpisodeRunner(actor_id=actor_id, epoch=epoch, env_factory=env_factory, chat=chat, client=client,
                               link=link,
                               sampling=Sampling(a.temperature, a.max_new_tokens, v.max_model_len, a.max_turns,
                                                 a.context_turns),
                               metrics=metrics, tasks=tasks_in_play,
                               frozen_clients={agent: frozen_client for agent in a.frozen_agents})
        tasks = [asyncio.create_task(link.run()), asyncio.create_task(_play_then_idle(runner, a.concurrent_episodes))]
        if cfg.tasks.order == "spo":
            announcements = subscriber(ctx, bind_address(net.learner_address, net.learner_pub_port), keys_for(net))
            tasks.append(asyncio.create_task(follow_announcements(announcements, values, metrics,
                                                                  net.max_message_bytes)))
        if cfg.tasks.eval_split:  # held-out tasks, played every tasks.eval_every versions, never streamed
            tasks.append(asyncio.create_task(evaluator_for(cfg, runner, startup_env(), actor_index).run()))
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


async def _play_then_idle(runner, concurrent_episodes: int) -> None:
    """Play until the task source runs out (tasks.epochs), then keep the process (and its link, which still
    delivers the last chunks) up until it is stopped."""
    await runner.run(concurrent_episodes)
    if not getattr(runner.tasks, "draining", False):
        log.info("%s: the task source ran out (tasks.epochs); no more episodes", runner.actor_id)
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
