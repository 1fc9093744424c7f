"""The buffer's ingest pool on the whole path: real BufferLink -> BufferServer -> batch requests (real sockets).

Large chunks are received into slabs; once the learner has been served them, nothing in the buffer may
keep them, or the slabs would never come back and every later frame would miss the pool. Four times the
pool's capacity flows through here, paced by a consumer, with no miss and every token intact.
"""
from __future__ import annotations

import asyncio

import numpy as np
import zmq.asyncio

from actors.link import BufferLink
from actors.metrics import ActorMetrics
from buffer.metrics import BufferMetrics
from buffer.server import BufferServer
from buffer.slab_receive import SLAB_BYTES
from buffer.store import ReplayStore
from learner.main import BatchClient
from tests.helpers import chunk, in_pool, stop_in_process_buffer, until

N_OBS = 250_000  # a 1 MB observation frame per chunk


def obs_of(e: int) -> np.ndarray:
    return (np.arange(N_OBS) * 7 + e) % 30000


async def test_slabs_come_back_after_their_chunks_are_served():
    metrics = BufferMetrics()
    store = ReplayStore(batch_episodes=8, eta=100, max_staleness=100, max_running=64, max_items=64,
                        episode_timeout_s=60, actor_timeout_s=60, metrics=metrics)
    limit = 1 << 27  # a batch of eight 1 MB episodes carries ~50 MB of per-token arrays
    server = BufferServer(store, metrics, ingest_addr="tcp://127.0.0.1:0", serve_addr="tcp://127.0.0.1:0",
                          version_addr=None, max_message_bytes=limit, housekeeping_s=0.1,
                          ingest_pool_bytes=2 * SLAB_BYTES)
    ctx = zmq.asyncio.Context()
    link = BufferLink(ctx, f"tcp://127.0.0.1:{server.ingest_port}", actor_id="actor-p", epoch=1, slots=0,
                      max_unacked=8, resend_after_s=30, metrics=ActorMetrics(), max_message_bytes=limit)
    learner = BatchClient(ctx, f"tcp://127.0.0.1:{server.serve_port}", limit)
    tasks = [asyncio.create_task(server.run()), asyncio.create_task(link.run())]
    per_round, rounds = 8, 4 * 2 * SLAB_BYTES // (8 * 4 * N_OBS) + 1
    try:
        for r in range(rounds):
            for i in range(per_round):
                e = r * per_round + i
                await link.send(chunk(f"e{e}", 0, seq=e, actor_id="actor-p", epoch=1, done=True, obs=obs_of(e)))
            await until(lambda: not link.unacked, "every chunk acked", 30.0)
            held = [c.obs_tokens for ep in store.ready.values() for c in ep.turns.values()]
            assert len(held) == per_round and all(in_pool(server.receiver.pool, a) for a in held)
            del held
            batch = await asyncio.wait_for(learner.get(0, per_round), 30)
            assert len(batch.episode_ids) == per_round
            for k, ep in enumerate(batch.episode_ids):
                start, end = batch.episode_offsets[k], batch.episode_offsets[k + 1]
                np.testing.assert_array_equal(batch.tokens[start:start + N_OBS], obs_of(int(ep[1:])))
                assert end - start == N_OBS + 1  # the observation and the one generated token
        sample = metrics.registry.get_sample_value
        assert sample("turnstream_buffer_chunks_total", {"outcome": "ok"}) == rounds * per_round
        assert sample("turnstream_buffer_ingest_pool_misses_total") == 0
    finally:
        await stop_in_process_buffer(tasks, server, ctx)
