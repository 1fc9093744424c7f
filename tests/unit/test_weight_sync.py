"""Weight-sync control flow against fake vLLM servers: disk and nccl (fake transport), parallel pushes,
keep-mode pause with resume in `finally`, servers that were down re-synced when they return."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from turnstream.learner.sync.base import WeightSyncError

from turnstream.learner.sync.disk import DiskWeightSync
from turnstream.learner.weights.buckets import WeightBuckets

from turnstream.learner.sync.nccl import NcclWeightSync
from tests.unit.fake_vllm import FakeVllm
from turnstream.core.urls_file import watch_urls_file, write_urls_file
from turnstream.learner.sync.factory import make_weight_sync

DISK_SEQUENCE = ["pause?mode=keep&clear_cache=false", "collective_rpc", "update_weight_version", "resume"]
NCCL_SEQUENCE = ["init_weight_transfer_engine", "pause?mode=keep&clear_cache=false", "start_weight_update",
                 "update_weights", "finish_weight_update", "resume"]


@pytest.fixture
async def servers():
    log: list = []
    fakes = [await FakeVllm(name).start() for name in ("a", "b")]
    for f in fakes:
        f.log = log
        f.control_delay_s = 0.05  # long enough that a sequential push would visibly interleave differently
    yield fakes
    for f in fakes:
        await f.stop()


def _routes(fake) -> list[str]:
    return [name for name, _ in fake.calls if name != "get_world_size"]


def _state() -> dict:
    return {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(3)}


async def test_disk_push_is_parallel_keep_mode_and_labels_the_version(servers, tmp_path):
    a, b = servers
    sync = DiskWeightSync([a.url, b.url], tmp_path / "w", tmp_path)
    path = sync.save(WeightBuckets(_state(), None), 3)
    await sync.push(path, 3)
    for f in servers:
        assert _routes(f) == DISK_SEQUENCE and f.version == "3"
        assert f.calls[1][1] == {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}
    first_resume = min(i for i, (_, route) in enumerate(a.log) if route == "resume")
    assert {srv for srv, route in a.log[:first_resume] if route.startswith("pause")} == {"a", "b"}
    assert sync.behind() == []


async def test_disk_resume_always_follows_a_failed_transfer(servers, tmp_path):
    a, b = servers
    a.fail_control = {"collective_rpc"}
    sync = DiskWeightSync([a.url, b.url], tmp_path / "w", tmp_path)
    with pytest.raises(WeightSyncError, match="1 of 2"):
        await sync.push(sync.save(WeightBuckets(_state(), None), 1), 1)
    assert _routes(a)[-1] == "resume" and b.version == "1"
    assert sync.behind() == [a.url]


async def test_disk_server_down_during_push_is_resynced_when_it_returns(servers, tmp_path):
    a, b = servers
    sync = DiskWeightSync([a.url, b.url], tmp_path / "w", tmp_path, keep=2)
    port = int(b.url.rsplit(":", 1)[1])
    await b.stop()
    with pytest.raises(WeightSyncError, match=b.url):
        await sync.push(sync.save(WeightBuckets(_state(), None), 1), 1)
    assert sync.behind() == [b.url] and await sync.resync() == []  # still down: nothing to do
    with pytest.raises(WeightSyncError):
        await sync.push(sync.save(WeightBuckets(_state(), None), 2), 2)
    assert a.version == "2"
    await b.start(port)  # it comes back (a fresh server: default weights)
    b.calls.clear()
    assert await sync.resync() == [b.url]
    assert b.version == "2" and _routes(b) == DISK_SEQUENCE and sync.behind() == []


async def test_disk_watch_resyncs_in_the_background(servers, tmp_path):
    a, b = servers
    sync = DiskWeightSync([a.url], tmp_path / "w", tmp_path)
    await sync.push(sync.save(WeightBuckets(_state(), None), 4), 4)
    sync.add_server(b.url)  # a server joins between pushes
    watcher = asyncio.create_task(sync.watch(0.05))
    for _ in range(200):
        if not sync.behind():
            break
        await asyncio.sleep(0.02)
    watcher.cancel()
    assert b.version == "4" and sync.behind() == []


async def test_a_server_added_to_the_urls_file_is_brought_to_the_current_weights(servers, tmp_path):
    a, b = servers
    sync = DiskWeightSync([a.url], tmp_path / "w", tmp_path)
    await sync.push(sync.save(WeightBuckets(_state(), None), 3), 3)
    urls_file = tmp_path / "vllm_urls.txt"
    write_urls_file(urls_file, [a.url, b.url])
    tasks = [asyncio.create_task(watch_urls_file(urls_file, sync.set_urls, 0.02)),
             asyncio.create_task(sync.watch(0.05))]
    for _ in range(200):
        if b.url in sync.urls and not sync.behind():
            break
        await asyncio.sleep(0.02)
    assert b.version == "3" and sync.behind() == []
    write_urls_file(urls_file, [b.url])  # a leaves the fleet: later pushes skip it
    for _ in range(200):
        if sync.urls == [b.url]:
            break
        await asyncio.sleep(0.02)
    for t in tasks:
        t.cancel()
    await sync.push(sync.save(WeightBuckets(_state(), None), 4), 4)
    assert (a.version, b.version) == ("3", "4")


def test_factory_builds_each_backend(tmp_path):
    assert isinstance(make_weight_sync("disk", [], weights_dir=tmp_path, model_dir=tmp_path), DiskWeightSync)
    nccl = make_weight_sync("nccl", ["http://x:1"], master_address="10.0.0.1", master_port=29600,
                            transport=FakeTransport([]))
    assert isinstance(nccl, NcclWeightSync)
    with pytest.raises(ValueError, match="unknown backend"):
        make_weight_sync("carrier-pigeon", [])


# ---- nccl with a fake transport ----------------------------------------------------------------------

class FakeTransport:
    """Rank 0 of a fake NCCL group. Like the real one, each call blocks until every server's matching HTTP
    call is in flight (a collective needs all members), so a push that does not overlap them deadlocks and
    fails the test by timeout. Counts are cumulative, so no reset can race with an early arrival."""

    def __init__(self, servers: list[FakeVllm]):
        self.arrived: dict[str, int] = {}
        self.released: dict[str, int] = {}
        self.lock = threading.Lock()
        self.expected = len(servers)  # servers (not workers) that must join each collective
        self.inits: list[tuple[str, int, int]] = []
        self.sent: list[list[tuple[str, tuple]]] = []
        self.closed = 0
        for s in servers:
            s.hooks["init_weight_transfer_engine"] = lambda body: self._worker_side("init")
            s.hooks["update_weights"] = lambda body: self._worker_side("update")

    async def _worker_side(self, name: str) -> None:
        with self.lock:
            mine = self.arrived.get(name, 0)
            self.arrived[name] = mine + 1
        for _ in range(500):
            if self.released.get(name, 0) > mine:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"learner never joined {name}")

    def _learner_side(self, name: str) -> None:
        deadline = time.monotonic() + 5
        needed = self.released.get(name, 0) + self.expected
        while self.arrived.get(name, 0) < needed:
            assert time.monotonic() < deadline, f"servers never joined {name}"
            time.sleep(0.01)
        with self.lock:
            self.released[name] = needed

    def init_group(self, master_address, master_port, world_size):
        self.inits.append((master_address, master_port, world_size))
        self._learner_side("init")

    def send(self, tensors):
        self.sent.append([(n, tuple(t.shape)) for n, t in tensors])
        self._learner_side("update")

    def close(self):
        self.closed += 1


def _nccl(servers, transport) -> NcclWeightSync:
    return NcclWeightSync([s.url for s in servers], master_address="10.0.0.1", master_port=29600,
                          transport=transport)


async def test_nccl_push_control_flow(servers):
    a, b = servers
    b.world = 2  # e.g. TP=2: two workers, ranks 2 and 3
    transport = FakeTransport(servers)
    sync = _nccl(servers, transport)
    payload = sync.save(WeightBuckets(_state(), None), 5)
    await sync.push(payload, 5)
    assert transport.inits == [("10.0.0.1", 29600, 4)]  # learner + 1 + 2 workers
    inits = {f.name: dict(f.calls)["init_weight_transfer_engine"]["init_info"] for f in servers}
    assert inits["a"]["rank_offset"] == 1 and inits["b"]["rank_offset"] == 2
    assert all(i["world_size"] == 4 and i["master_port"] == 29600 for i in inits.values())
    for f in servers:
        assert _routes(f) == NCCL_SEQUENCE
        calls = dict(f.calls)
        assert calls["update_weights"]["update_info"] == {"names": ["w", "b"], "dtype_names": ["float32"] * 2,
                                                          "shapes": [[2, 3], [3]]}
        assert calls["finish_weight_update"] == {"weight_version": "5"} and f.version == "5"
    assert transport.sent == [[("w", (2, 3)), ("b", (3,))]]
    assert str(payload) == "nccl:v000005"
    # the second push reuses the group
    await sync.push(sync.save(WeightBuckets(_state(), None), 6), 6)
    assert sync.groups_built == 1 and len(transport.inits) == 1 and a.version == b.version == "6"


async def test_nccl_server_down_then_back_rebuilds_the_group(servers):
    a, b = servers
    transport = FakeTransport(servers)
    sync = _nccl(servers, transport)
    await sync.push(sync.save(WeightBuckets(_state(), None), 1), 1)
    port = int(b.url.rsplit(":", 1)[1])
    await b.stop()
    transport.expected = 1
    with pytest.raises(WeightSyncError, match=b.url):
        await sync.push(sync.save(WeightBuckets(_state(), None), 2), 2)
    assert a.version == "2" and sync.members == [a.url] and sync.behind() == [b.url]
    assert transport.inits[-1][2] == 2  # learner + a's one worker
    await b.start(port)
    transport.expected = 2
    assert await sync.resync() == [b.url]
    assert b.version == "2" and sync.members == [a.url, b.url] and transport.inits[-1][2] == 3
    assert sync.groups_built == 3


async def test_nccl_failure_inside_the_collective_tears_the_group_down_and_resumes(servers):
    a, b = servers
    transport = FakeTransport(servers)
    sync = _nccl(servers, transport)
    await sync.push(sync.save(WeightBuckets(_state(), None), 1), 1)
    a.fail_control = {"start_weight_update"}
    with pytest.raises(WeightSyncError):
        await sync.push(sync.save(WeightBuckets(_state(), None), 2), 2)
    assert sync.members is None and transport.closed == 1
    for f in servers:
        assert _routes(f)[-2:] == ["resume", "shutdown_weight_transfer_engine"]
    a.fail_control = set()
    await sync.push(sync.save(WeightBuckets(_state(), None), 3), 3)
    assert a.version == b.version == "3" and sync.groups_built == 2


NCCL = ["vllm.weight_sync.backend=nccl", "vllm.weight_sync.master_address='10.1.2.3'",
        "vllm.weight_sync.master_port=29600"]


def test_backend_from_config(tmp_path):
    from turnstream.learner.sync.factory import weight_sync_from_config
    from turnstream.core.config import load_config

    cfg = load_config(None, ["vllm.urls=['http://127.0.0.1:9']", f"model.path='{tmp_path}'"])
    sync = weight_sync_from_config(cfg, tmp_path / "weights")
    assert isinstance(sync, DiskWeightSync) and sync.dir == (tmp_path / "weights").resolve()
    cfg = load_config(None, ["vllm.urls=['http://127.0.0.1:9']", *NCCL])
    sync = weight_sync_from_config(cfg, tmp_path)
    assert isinstance(sync, NcclWeightSync) and (sync.master_address, sync.master_port) == ("10.1.2.3", 29600)


@pytest.mark.parametrize("overrides, overlaps", [
    ([], True),  # eta 2, disk: asynchronous, the push reads its saved snapshot
    (["buffer.eta=0"], False),  # the synchronous baseline: generate, train, push, repeat
    (NCCL, False),  # nccl broadcasts the live parameters
    (["buffer.eta=0", "learner.overlap_push=true"], True),  # asked for explicitly
    (["learner.overlap_push=false"], False),
])
def test_push_overlaps_training_only_where_it_is_safe(overrides, overlaps):
    from turnstream.learner.serve import push_overlaps_training
    from turnstream.core.config import load_config

    cfg = load_config(None, ["vllm.urls=['http://127.0.0.1:9']", *overrides])
    assert push_overlaps_training(cfg) is overlaps


def test_every_backend_saves_one_type():
    """save() takes a WeightBuckets source whatever the backend (a state dict is one bucket of it): the caller
    builds it once, and no backend tells a dict from a source."""
    import inspect

    from turnstream.learner.sync.base import WeightSync
    from turnstream.learner.sync.lora import LoraAdapterSync

    for backend in (WeightSync, DiskWeightSync, LoraAdapterSync, NcclWeightSync):
        assert str(inspect.signature(backend.save).parameters["weights"].annotation) == "WeightBuckets", backend


def test_a_state_dict_is_pushed_as_one_bucket_of_its_tensors(tmp_path):
    from safetensors.torch import load_file

    state = _state()
    path = DiskWeightSync([], tmp_path / "w", tmp_path).save(WeightBuckets(state, None), 2)
    assert sorted(p.name for p in path.glob("*.safetensors")) == ["model.safetensors"]
    written = load_file(path / "model.safetensors")
    assert written.keys() == state.keys() and all(torch.equal(written[k], state[k]) for k in state)
