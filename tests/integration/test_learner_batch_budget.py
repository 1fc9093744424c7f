"""The learner's batch client asks by token budget (learner.batch_max_tokens) and a real BufferServer, over
real sockets, fills the batch up to it."""
from __future__ import annotations

import asyncio

import zmq.asyncio

from buffer.metrics import BufferMetrics
from buffer.server import BufferServer
from buffer.store import ReplayStore
from learner.main import BatchClient
from tests.helpers import chunk


async def test_batch_client_token_budget_bounds_the_batch():
    metrics = BufferMetrics()
    store = ReplayStore(batch_episodes=8, eta=9, max_staleness=9, max_running=100, max_items=100,
                        episode_timeout_s=60, actor_timeout_s=60, metrics=metrics)
    server = BufferServer(store, metrics, ingest_addr="tcp://127.0.0.1:0", serve_addr="tcp://127.0.0.1:0",
                          version_addr=None, max_message_bytes=1 << 20)
    for e in range(6):  # 3 observation + 2 generated tokens each
        assert store.ingest(b"a", chunk(f"e{e}", 0, seq=e, done=True, obs=(1, 2, 3), gen=(4, 5)))[0] == "ok"
    ctx = zmq.asyncio.Context()
    task = asyncio.create_task(server.run())
    try:
        client = BatchClient(ctx, f"tcp://127.0.0.1:{server.serve_port}", 1 << 20, None)
        batch = await asyncio.wait_for(client.get(0, 8, max_tokens=12), 30)
        assert batch.episode_ids == ["e0", "e1"]  # a third episode would make 15 tokens
        batch = await asyncio.wait_for(client.get(0, 3), 30)  # no budget: by episode count
        assert batch.episode_ids == ["e2", "e3", "e4"]
    finally:
        task.cancel()
        server.close()
        ctx.destroy(linger=0)
