"""The nccl backend takes a push source bucket by bucket: the names, shapes and dtypes go to the servers
before any tensor, a read-once (sharded) source is read exactly once per push, also when the push fails
before its broadcast (the other ranks are gathering with it), and a resync never reads it again."""
from __future__ import annotations

import pytest
import torch

from tests.unit.test_weight_sync import FakeTransport, _state, servers  # noqa: F401  (servers: a fixture)
from turnstream.learner.sync.base import WeightSyncError
from turnstream.learner.weights.buckets import WeightBuckets
from turnstream.learner.sync.nccl import NcclWeightSync


def _read_once(announced: list) -> WeightBuckets:
    source = WeightBuckets(_state(), torch.bfloat16, bucket_bytes=12, announce=lambda _: announced.append(1))
    source.replayable = False  # as a sharded source, whose gathers are collectives
    return source


async def test_nccl_reads_a_sharded_source_once_per_push_even_when_it_fails(servers):  # noqa: F811
    a, b = servers
    transport = FakeTransport(servers)
    sync = NcclWeightSync([a.url, b.url], master_address="10.0.0.1", master_port=29600, transport=transport)
    announced: list = []
    first = _read_once(announced)
    assert len(first.buckets) == 2
    await sync.push(sync.save(first, 1), 1)
    assert announced == [1] and first.spent and transport.sent == [[("w", (2, 3)), ("b", (3,))]]
    info = dict(a.calls)["update_weights"]["update_info"]
    assert info["dtype_names"] == ["bfloat16"] * 2 and info["names"] == ["w", "b"]

    a.fail_control = {"start_weight_update"}
    second = _read_once(announced)
    with pytest.raises(WeightSyncError):
        await sync.push(sync.save(second, 2), 2)
    assert announced == [1, 1] and second.spent and len(transport.sent) == 1  # gathered, never broadcast
    a.fail_control = set()
    assert await sync.resync() == [] and announced == [1, 1]  # the next push brings the servers up
