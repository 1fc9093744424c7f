"""The learner's batch client asks by token budget (learner.batch_max_tokens) and a real BufferServer, over
real sockets, fills the batch up to it."""
from __future__ import annotations

import asyncio

import zmq.asyncio

from turnstream.learner.batch_client import BatchClient
from turnstream.protocol.chunk_batch import pack
from tests.helpers import chunk, in_process_buffer


async def test_batch_client_token_budget_bounds_the_batch():
    server, store, _metrics = in_process_buffer(batch_episodes=8, eta=9)
    for e in range(6):  # 3 observation + 2 generated tokens each
        c = chunk(f"e{e}", 0, seq=e, done=True, obs=(1, 2, 3), gen=(4, 5))
        assert store.ingest_message(b"a", pack([c])) == [(e, "ok", "")]
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
