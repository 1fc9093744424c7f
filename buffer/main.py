"""`turnstream buffer`: run the replay buffer process."""
from __future__ import annotations

import asyncio
import gc
import logging

from turnstream.core.config import Config

log = logging.getLogger("turnstream.buffer")


async def serve(cfg: Config) -> None:
    from pathlib import Path

    from turnstream.buffer.audit import open_buffer_audit
    from turnstream.buffer.pass_rate_file import keep_writing
    from turnstream.buffer.metrics import BufferMetrics
    from turnstream.buffer.store.ratelimit import RateLimiter
    from turnstream.buffer.server import BufferServer
    from turnstream.buffer.store.replay_store import ReplayStore
    from turnstream.buffer.store_metrics import meter
    from turnstream.protocol.auth import keys_for
    from turnstream.protocol.role_process import RoleProcess, finish
    from turnstream.protocol.sockets import bind_address

    b, net = cfg.buffer, cfg.network
    metrics = BufferMetrics()
    limiter = RateLimiter(b.samples_per_insert, b.min_size_to_sample, b.error_buffer or float("inf"))
    store = ReplayStore(batch_episodes=b.batch_episodes, eta=b.eta, max_staleness=b.max_staleness,
                        max_running=b.max_running, max_items=b.max_items, episode_timeout_s=b.episode_timeout_s,
                        actor_timeout_s=b.actor_timeout_s, policy=b.sampling,
                        group_size=cfg.tasks.group_size, limiter=limiter, group_timeout_s=b.group_timeout_s,
                        drop_uniform_groups=b.drop_uniform_groups, segment_turns=b.segment_turns,
                        segment_after_s=b.segment_after_s, positive=positive_replay(b),
                        critic=critic_replay(cfg))
    meter(store, metrics)
    journal = open_journal(cfg, store, metrics) if b.wal else None
    # The store's listeners hear it in the order attached, after the log was replayed: the audit's lines for
    # served and dropped episodes come before the journal's records of them (buffer/audit.py says why).
    audit = open_buffer_audit(cfg.run.run_dir)  # None unless TURNSTREAM_AUDIT=1
    if audit is not None:
        store.listeners.add(audit)
    if journal is not None:
        store.listeners.add(journal)
    version_addr = bind_address(net.learner_address, net.learner_pub_port) if net.learner_pub_port else None
    server = BufferServer(store, metrics, ingest_addr=bind_address(net.listen_host, net.buffer_ingest_port),
                          serve_addr=bind_address(net.listen_host, net.buffer_serve_port), version_addr=version_addr,
                          max_message_bytes=net.max_message_bytes, journal=journal, audit=audit,
                          ack_delay_s=b.ack_delay_ms / 1000, curve=keys_for(net))
    role = RoleProcess(metrics.registry, net.listen_host, b.metrics_port,
                       health=lambda: {"learner_version": store.learner_version})
    async with role:
        log.info("buffer: ingest port %d, serve port %d, metrics port %d", server.ingest_port, server.serve_port,
                 role.metrics_port)
        # What start-up created (modules, the replayed log) lives as long as the process: out of the collector's
        # sight, full collections walk only what ingest adds.
        gc.freeze()
        tasks = [asyncio.create_task(server.run())]
        if store.positive is not None:
            tasks.append(asyncio.create_task(keep_writing(Path(cfg.run.run_dir) / "pass_rates.json", store.positive)))
        await role.until_stopped(tasks)
        await server.shutdown()
        try:
            await finish(tasks)
        finally:
            server.close()  # closes the write-ahead log, after an fsync of what it still holds
            log.info("buffer: stopped%s", ", write-ahead log synced" if journal is not None else "")


def positive_replay(b):
    """buffer.positive_replay's store part, or None when it is off."""
    from turnstream.buffer.store.positive_replay import PositiveReplay

    p = b.positive_replay
    if p.share <= 0:
        return None
    return PositiveReplay(share=p.share, hard_below=p.hard_below, success_return=p.success_return, window=p.window,
                          max_replays=p.max_replays)


def critic_replay(cfg: Config):
    """buffer.critic_replay's store part, or None when it is off."""
    from turnstream.buffer.store.critic_replay import CriticReplayPool

    c = cfg.buffer.critic_replay
    if c.share <= 0:
        return None
    return CriticReplayPool(share=c.share, max_staleness=c.max_staleness, capacity=c.capacity, seed=cfg.run.seed)


def open_journal(cfg: Config, store, metrics):
    """Open the write-ahead log, rebuild the store from it, and compact away what was consumed."""
    from pathlib import Path

    from turnstream.buffer.durability.journal import WalJournal
    from turnstream.buffer.durability.wal import WalFile

    b = cfg.buffer
    wal_dir = Path(b.wal_dir) if b.wal_dir else Path(cfg.run.run_dir) / "buffer-wal"
    wal = WalFile(wal_dir / "wal.log", fsync=b.wal_fsync, fsync_interval_s=b.wal_fsync_interval_s)
    journal = WalJournal(wal, metrics, compact_bytes=b.wal_compact_bytes)
    records = journal.replay(store)
    journal.compact(store)
    log.info("buffer: write-ahead log %s: replayed %d records (%d ready, %d running episodes), fsync %s",
             wal.path, records, len(store.ready), len(store.in_progress), b.wal_fsync)
    return journal


def main(cfg: Config) -> None:
    asyncio.run(serve(cfg))
