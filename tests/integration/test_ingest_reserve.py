"""The buffer's warm heap reserve (buffer/warm_heap.py) in a real buffer process, over real sockets.

Two rounds of forty 1 MB chunks go in, each consumed by batch requests before the next. With a 64 MiB
reserve the buffer process takes almost no page faults while it ingests (its own
`turnstream_buffer_page_faults_total`, the signal an operator sizes the reserve by), in the first round (the reserve
is warm) and in the second too: that holds only if the first round's frames went back to the heap once
they were served, since both rounds together do not fit in the reserve. Without the reserve, every kept
megabyte is faulted in (about 256 faults of 4 KiB). Every token arrives intact either way.
"""
from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest
import zmq

from turnstream.protocol.codec import decode, encode
from turnstream.protocol.messages import Batch, BatchRequest
from tests.helpers import BufferProcess, acks_in, chunk

N_OBS = 250_000  # a 1 MB observation frame per chunk
PER_ROUND, BATCH = 40, 8
MESSAGE_LIMIT = 1 << 27  # a batch of eight 1 MB episodes carries ~50 MB of per-token arrays
FAULTS = "turnstream_buffer_page_faults_total"

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the reserve is glibc's malloc")


def obs_of(e: int) -> np.ndarray:
    return (np.arange(N_OBS) * 7 + e) % 30000


def run_rounds(tmp_path: Path, reserve_bytes: int) -> list[float]:
    """Page faults the buffer process took per MB ingested, for each round."""
    buffer = BufferProcess(tmp_path, max_message_bytes=MESSAGE_LIMIT, ingest_reserve_bytes=reserve_bytes,
                           wal=False,  # the log's file writes are not what this measures
                           batch_episodes=BATCH, eta=100, max_staleness=100, max_items=2 * PER_ROUND,
                           max_running=2 * PER_ROUND)
    ctx = zmq.Context()
    try:
        buffer.start()
        actor, learner = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
        actor.connect(f"tcp://127.0.0.1:{buffer.cfg.network.buffer_ingest_port}")
        learner.connect(f"tcp://127.0.0.1:{buffer.cfg.network.buffer_serve_port}")
        faults_per_mb = []
        for r in range(2):
            episodes = range(r * PER_ROUND, (r + 1) * PER_ROUND)
            before = buffer.metric(FAULTS)
            for e in episodes:
                actor.send_multipart(encode(chunk(f"e{e}", 0, seq=e, done=True, obs=obs_of(e))))
            acked = []
            while len(acked) < PER_ROUND:
                assert actor.poll(30_000), f"acks for {len(acked)} of {PER_ROUND} chunks"
                acked += [status for _, status in acks_in(decode(actor.recv_multipart()))]
            assert acked == ["ok"] * PER_ROUND
            faults_per_mb.append((buffer.metric(FAULTS) - before) / (PER_ROUND * 4 * N_OBS / 1e6))
            served = []
            for i in range(PER_ROUND // BATCH):
                learner.send_multipart(encode(BatchRequest(request_id=r * 100 + i, learner_version=0,
                                                           max_episodes=BATCH)))
                assert learner.poll(30_000), "no batch"
                batch = decode(learner.recv_multipart(copy=False), MESSAGE_LIMIT)
                assert isinstance(batch, Batch) and len(batch.episode_ids) == BATCH
                for k, ep in enumerate(batch.episode_ids):
                    start, end = batch.episode_offsets[k], batch.episode_offsets[k + 1]
                    np.testing.assert_array_equal(batch.tokens[start:start + N_OBS], obs_of(int(ep[1:])))
                    assert end - start == N_OBS + 1  # the observation and the one generated token
                served += batch.episode_ids
            assert sorted(served) == sorted(f"e{e}" for e in episodes)
        return faults_per_mb
    finally:
        buffer.procs.stop_all()
        ctx.destroy(linger=0)


def test_kept_frames_take_no_page_faults_with_the_reserve_and_its_memory_comes_back(tmp_path):
    faults = run_rounds(tmp_path, reserve_bytes=64 * 1024 * 1024)
    assert max(faults) < 16, f"page faults per MB ingested, per round: {faults}"


def test_without_the_reserve_every_kept_megabyte_is_faulted_in(tmp_path):
    faults = run_rounds(tmp_path, reserve_bytes=0)
    assert faults[0] > 128, f"page faults per MB ingested, per round: {faults}"
