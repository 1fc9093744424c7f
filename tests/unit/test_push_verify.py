"""Push verification (learner/sync/verify.py, probe.py): the comparison, when a push is verified, and what a
server that took a push but does not serve it gets, against fake vLLM servers (tests/e2e/test_push_verify_vllm.py
does it against a real one)."""
from __future__ import annotations

import asyncio
import logging
import math

import pytest
import torch
from prometheus_client import generate_latest

from tests.unit.fake_vllm import FakeVllm
from turnstream.learner.metrics import LearnerMetrics
from turnstream.learner.sync.base import WeightSyncError
from turnstream.learner.sync.disk import DiskWeightSync
from turnstream.learner.weights.buckets import WeightBuckets
from turnstream.learner.sync.probe import PROBE_LENGTH, model_logprobs, probe_tokens, prompt_logprobs
from turnstream.learner.sync.verify import FleetUnverified, PushVerifier, compare, tolerance_for


# ---- the comparison -------------------------------------------------------------------------------------

def test_equal_log_probs_match():
    c = compare([-1.0, -2.0], [-1.0, -2.0], 1e-3)
    assert c.ok and c.mean_abs == 0 and c.max_abs == 0


def test_the_mean_is_bounded_not_the_largest_difference():
    expected = [-1.0] * 10
    one_outlier = [-1.0] * 9 + [-1.005]  # mean 5e-4, max 5e-3: one token's rounding noise
    c = compare(expected, one_outlier, 1e-3)
    assert c.ok and c.max_abs == pytest.approx(5e-3) and c.mean_abs == pytest.approx(5e-4)
    everywhere = [-1.002] * 10  # other weights move every token
    assert not compare(expected, everywhere, 1e-3).ok


def test_a_difference_at_the_tolerance_passes_and_above_fails():
    assert compare([-1.0], [-1.5], 0.5).ok
    assert not compare([-1.0], [-1.5000001], 0.5).ok


@pytest.mark.parametrize("served", [[-1.0, math.nan], [-1.0, -math.inf]])
def test_a_non_finite_log_prob_never_matches(served):
    c = compare([-1.0, -2.0], served, 1e3)
    assert not c.ok and c.max_abs == math.inf


def test_lengths_must_agree():
    with pytest.raises(ValueError, match="1 served log-probs for 2 expected"):
        compare([-1.0, -2.0], [-1.0], 1e-3)
    with pytest.raises(ValueError):
        compare([], [], 1e-3)


def test_auto_tolerance_follows_the_served_dtype():
    assert tolerance_for("auto", torch.float32) == 1e-3
    assert tolerance_for("auto", torch.bfloat16) == tolerance_for("auto", torch.float16) == 5e-2
    assert tolerance_for(0.2, torch.float32) == 0.2


# ---- the probe ------------------------------------------------------------------------------------------

def test_probe_is_fixed_and_inside_the_ordinary_vocabulary():
    assert probe_tokens(512) == probe_tokens(512) and len(probe_tokens(512)) == PROBE_LENGTH
    assert all(0 <= t < 512 for t in probe_tokens(512))
    assert all(0 <= t < 32000 for t in probe_tokens(151936))
    assert len(set(probe_tokens(151936))) == PROBE_LENGTH


def test_prompt_logprobs_are_read_per_probe_token():
    tokens = (5, 9, 2)
    payload = {"prompt_logprobs": [None, {"9": {"logprob": -1.5, "rank": 3}, "4": {"logprob": -0.1, "rank": 1}},
                                   {"2": {"logprob": -2.5, "rank": 7}}]}
    assert prompt_logprobs(payload, tokens) == [-1.5, -2.5]
    for bad in ({}, {"prompt_logprobs": None}, {"prompt_logprobs": [None, {"9": {"logprob": -1}}]},
                {"prompt_logprobs": [None, {"8": {"logprob": -1}}, {"2": {"logprob": -1}}]}):
        with pytest.raises(WeightSyncError, match="malformed prompt log-probs"):
            prompt_logprobs(bad, tokens)


def test_model_logprobs_are_the_causal_log_probs_of_the_next_token():
    """Through the learner's network (a MicroBatch in, logits at its actions out), as the learner calls it."""
    from turnstream.learner.estimators.critic import PolicyAndValue

    class Bigram(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Embedding(8, 8)

        def forward(self, input_ids, position_ids=None, use_cache=False):
            return type("Out", (), {"logits": self.table(input_ids)})()

    net = PolicyAndValue(Bigram(), None)
    tokens = (1, 4, 6)
    table = torch.log_softmax(net.model.table.weight.detach(), -1)
    got = model_logprobs(net, tokens, torch.float32)
    assert got == pytest.approx([table[1, 4].item(), table[4, 6].item()])
    assert net.training  # left as it was found
    assert model_logprobs(net, tokens, torch.bfloat16) == pytest.approx(got, abs=0.05)


# ---- when a push is verified ----------------------------------------------------------------------------

def test_due_every_nth_push_and_every_push_while_a_server_is_unverified():
    assert not any(PushVerifier(0, 1e-3, 4, 512).due(v) for v in range(10))
    every3 = PushVerifier(3, 1e-3, 4, 512)
    assert [v for v in range(10) if every3.due(v)] == [0, 3, 6, 9]
    every3.failed_checks["http://127.0.0.1:1"] = (2, 1)  # its check of version 2 failed
    assert all(every3.due(v) for v in range(10))


def test_the_unusable_label_stays_outside_the_staleness_bound():
    v = PushVerifier(1, 1e-3, 4, 512)
    for version in (0, 7, 100):
        label = v.unusable_version(version)
        assert version - label > 4  # actors/inference/fleet.py: usable while learner - server <= max_staleness


# ---- against fake servers -------------------------------------------------------------------------------

@pytest.fixture
async def servers():
    fakes = [await FakeVllm(name).start() for name in ("a", "b")]
    yield fakes
    for f in fakes:
        await f.stop()


def _sample(registry, name: str, url: str) -> float | None:
    return registry.get_sample_value(name, {"server": url})


async def test_a_server_that_does_not_serve_the_push_is_counted_named_relabelled_and_resynced(
        servers, tmp_path, caplog):
    a, b = servers
    metrics = LearnerMetrics()
    verifier = PushVerifier(1, 1e-3, 4, 512, metrics=metrics)
    sync = DiskWeightSync([a.url, b.url], tmp_path / "w", tmp_path, verifier=verifier)
    state = {"w": torch.ones(2)}
    expected = verifier.expect(7, [-1.0] * (PROBE_LENGTH - 1))
    b.prompt_logprob = -1.3  # b took the push but scores with other weights
    with caplog.at_level(logging.ERROR, "turnstream.learner"), pytest.raises(WeightSyncError, match=b.url) as info:
        await sync.push(sync.save(WeightBuckets(state, None), 7), 7, expected)
    assert a.url not in str(info.value)
    assert a.version == "7" and b.version == str(7 - 4 - 1)
    assert _sample(metrics.registry, "turnstream_learner_weight_verify_failures_total", b.url) == 1
    assert _sample(metrics.registry, "turnstream_learner_weight_verify_failures_total", a.url) is None
    assert _sample(metrics.registry, "turnstream_learner_weight_verified_version", a.url) == 7
    assert _sample(metrics.registry, "turnstream_learner_weight_verified_version", b.url) is None
    assert any(r.levelno == logging.ERROR and b.url in r.getMessage() and "NOT VERIFIED" in r.getMessage()
               for r in caplog.records)
    assert sync.behind() == [b.url] and verifier.unverified == {b.url}
    probe = b.sampling_params[-1]
    assert probe["prompt_logprobs"] == 0 and probe["max_tokens"] == 1

    b.prompt_logprob = -1.0  # the re-sync's reload works
    assert await sync.resync() == [b.url]
    assert b.version == "7" and sync.behind() == [] and verifier.unverified == set()
    assert _sample(metrics.registry, "turnstream_learner_weight_verified_version", b.url) == 7
    assert "turnstream_learner_weight_verify_failures_total" in generate_latest(metrics.registry).decode()


async def test_an_unanswered_probe_fails_the_server_and_an_unverified_push_checks_nothing(servers, tmp_path):
    a, b = servers
    verifier = PushVerifier(1, 1e-3, 4, 512)
    sync = DiskWeightSync([a.url, b.url], tmp_path / "w", tmp_path, verifier=verifier)
    b.fail_status = 500
    with pytest.raises(WeightSyncError, match="the probe could not be scored"):
        await sync.push(sync.save(WeightBuckets({"w": torch.ones(2)}, None), 2), 2, verifier.expect(2, [-1.0] * (PROBE_LENGTH - 1)))
    assert verifier.unverified == {b.url} and b.version == str(2 - 5)
    b.fail_status = 0
    served = a.served + b.served
    await sync.push(sync.save(WeightBuckets({"w": torch.ones(2)}, None), 3), 3)  # no expectation: labelled, not probed
    assert a.served + b.served == served and b.version == "3"


async def test_an_adapter_push_is_probed_under_the_adapter_name(servers, tmp_path):
    from turnstream.core.config_lora import LoraSection
    from turnstream.learner.sync.lora import LoraAdapterSync

    a, _ = servers
    lora = LoraSection(rank=2, alpha=4.0)
    verifier = PushVerifier(1, 1e-3, 4, 512, model=lora.served_name)
    sync = LoraAdapterSync([a.url], tmp_path / "w", lora, tmp_path, verifier=verifier)
    await sync.push(tmp_path, 1, verifier.expect(1, [-1.0] * (PROBE_LENGTH - 1)))
    assert a.models[-1] == lora.served_name and verifier.verified == {a.url: 1}


async def test_a_fleet_that_never_verifies_a_version_stops_the_learner_and_one_good_server_does_not(
        servers, tmp_path, caplog):
    a, b = servers
    verifier = PushVerifier(1, 1e-3, 4, 512, give_up_after=3)
    sync = DiskWeightSync([a.url, b.url], tmp_path / "w", tmp_path, verifier=verifier)
    expected = verifier.expect(4, [-1.0] * (PROBE_LENGTH - 1))
    path = sync.save(WeightBuckets({"w": torch.ones(2)}, None), 4)
    b.prompt_logprob = -1.3  # b never serves what it is pushed; a does
    with caplog.at_level(logging.ERROR, "turnstream.learner"), pytest.raises(WeightSyncError):
        await sync.push(path, 4, expected)
    for _ in range(4):  # the watcher's re-checks: b fails every one, a serves, so the learner goes on
        await sync.resync()
    assert verifier.failed_checks == {b.url: (4, 5)} and verifier.verified == {a.url: 4}
    # the served and expected log-probs are logged once for the version, beside an error line per check
    assert sum("probe log-probs of version 4" in r.getMessage() for r in caplog.records) == 1

    a.prompt_logprob = -1.3  # now neither serves what it is pushed
    expected = verifier.expect(5, [-1.0] * (PROBE_LENGTH - 1))
    with pytest.raises(WeightSyncError):  # the first check of each
        await sync.push(sync.save(WeightBuckets({"w": torch.ones(2)}, None), 5), 5, expected)
    assert await sync.resync() == []  # the second
    with pytest.raises(FleetUnverified, match="version 5 after 3 checks"):  # the third, in the watcher
        await asyncio.wait_for(sync.watch(interval_s=0.01), 5)


# ---- config ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("setting, value", [("verify_every", "-1"), ("verify_tolerance", "0.0"),
                                            ("verify_tolerance", "'loose'")])
def test_a_bad_setting_is_one_line_naming_it(setting, value):
    from turnstream.core.config import ConfigError, load_config

    with pytest.raises(ConfigError) as info:
        load_config(None, ["vllm.urls=['http://127.0.0.1:9']", f"vllm.weight_sync.{setting}={value}"])
    message = str(info.value)
    assert message.startswith(f"vllm.weight_sync.{setting}: ") and "\n" not in message


def test_verification_settings_reach_the_verifier_not_the_backend(tmp_path):
    from turnstream.core.config import load_config
    from turnstream.learner.sync.factory import verifier_from_config, weight_sync_from_config

    cfg = load_config(None, ["vllm.urls=['http://127.0.0.1:9']", "vllm.weight_sync.backend='nccl'",
                             "vllm.weight_sync.master_address='10.1.2.3'", "vllm.weight_sync.master_port=29600",
                             "vllm.weight_sync.verify_every=5", "vllm.weight_sync.verify_tolerance=0.2",
                             "buffer.max_staleness=6"])
    assert cfg.vllm.weight_sync.transfer_args() == {"master_address": "10.1.2.3", "master_port": 29600}
    verifier = verifier_from_config(cfg, 512, torch.bfloat16)
    assert (verifier.every, verifier.tolerance, verifier.max_staleness, verifier.model) == (5, 0.2, 6, None)
    sync = weight_sync_from_config(cfg, tmp_path, verifier)
    assert sync.verifier is verifier
    default = load_config(None, ["vllm.urls=['http://127.0.0.1:9']", "learner.lora.rank=4"])
    verifier = verifier_from_config(default, 512, torch.float32)  # adapter pushes: checked only where asked
    assert (verifier.every, verifier.tolerance, verifier.model) == (0, 1e-3, default.learner.lora.served_name)
    asked = load_config(None, ["vllm.urls=['http://127.0.0.1:9']", "learner.lora.rank=4",
                               "vllm.weight_sync.verify_every=1"])
    assert verifier_from_config(asked, 512, torch.float32).every == 1
