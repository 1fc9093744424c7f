"""Whether each server serves the weights just pushed to it: a version label alone can move on while the weights
never arrive (a reload that read another directory, an adapter that did not load, a transfer that skipped).

After a verified push (`vllm.weight_sync.verify_every`) every server that took it scores the fixed probe
(learner/sync/probe.py); its log-probs must be within `verify_tolerance` (mean |difference| over the probe's
tokens) of the learner's own for the pushed weights. A server that is not, or cannot be asked, is:
- counted (`turnstream_learner_weight_verify_failures_total{server}`) and logged as an error naming it;
- relabelled `version - buffer.max_staleness - 1`, a version outside the staleness bound: actors stop sending
  it requests at their next health check and the buffer drops any token it samples under that label, with no
  new rule on either side (actors/inference/fleet.py, the buffer's staleness bound);
- left behind in the weight sync's books, so `resync()` pushes the latest weights to it again, and verified
  at every push until one verifies it (`turnstream_learner_weight_verified_version{server}` then moves on).
When every server has failed `give_up_after` checks of the same version in a row, no server may sample for the
learner and none is coming back: the weight sync raises FleetUnverified, which stops the learner with an error.
learner/WEIGHT_SYNC.md says why this way.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp
import torch

from turnstream.learner.sync.server_calls import FleetUnverified, WeightSyncError, post
from turnstream.learner.sync.probe import probe_tokens, served_logprobs

log = logging.getLogger("turnstream.learner")

# verify_tolerance = "auto", by served dtype: far above the numerical gap between the learner's forward and
# vLLM's at the same weights, far below what different weights give (learner/WEIGHT_SYNC.md, "Verification").
AUTO_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 5e-2, torch.float16: 5e-2}


def tolerance_for(setting: float | str, dtype: torch.dtype) -> float:
    """`vllm.weight_sync.verify_tolerance` for servers that serve `dtype`."""
    return AUTO_TOLERANCE.get(dtype, AUTO_TOLERANCE[torch.bfloat16]) if setting == "auto" else float(setting)


@dataclass(frozen=True)
class Expected:
    """What every server must serve after the push of `version`: the learner's log-probs of the probe's tokens
    after the first, computed from the pushed weights."""
    version: int
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]


@dataclass(frozen=True)
class Comparison:
    mean_abs: float  # over the probe's tokens: what the tolerance bounds
    max_abs: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.mean_abs <= self.tolerance  # NaN (a non-finite log-prob) is never ok


def compare(expected: Sequence[float], served: Sequence[float], tolerance: float) -> Comparison:
    """How far a server's log-probs of the probe are from the learner's. The mean is bounded rather than the
    maximum: reduced-precision noise is per token and averages out, while other weights move most tokens."""
    if len(expected) != len(served) or not expected:
        raise ValueError(f"{len(served)} served log-probs for {len(expected)} expected")
    diffs = [abs(a - b) if math.isfinite(a) and math.isfinite(b) else math.inf for a, b in zip(expected, served)]
    return Comparison(sum(diffs) / len(diffs), max(diffs), tolerance)


class PushVerifier:
    """The verification of pushes: when one is due, the probe, the check of each server and what a mismatch does.
    `metrics`: the learner's (learner/metrics.py), or None (benchmarks, tests)."""

    def __init__(self, every: int, tolerance: float, max_staleness: int, vocab_size: int, *,
                 model: str | None = None, metrics=None, give_up_after: int = 12):
        self.every, self.tolerance, self.max_staleness = every, tolerance, max_staleness
        self.give_up_after = give_up_after
        self.tokens = probe_tokens(vocab_size)
        self.model = model  # the LoRA adapter actors sample (learner.lora.served_name); None: the base model
        self.metrics = metrics
        self.verified: dict[str, int] = {}  # server -> last version it was verified to serve
        # servers whose last check failed -> (the version, failed checks of it in a row); each is verified at every
        # push until one passes
        self.failed_checks: dict[str, tuple[int, int]] = {}
        self.probes = 0  # probes sent: each has a cache salt of its own (below)

    @property
    def unverified(self) -> set[str]:
        return set(self.failed_checks)

    def due(self, version: int) -> bool:
        """Whether the push of `version` is verified (the learner then computes `expect`'s log-probs)."""
        return self.every > 0 and (version % self.every == 0 or bool(self.failed_checks))

    def expect(self, version: int, logprobs: Sequence[float]) -> Expected:
        return Expected(version, self.tokens, tuple(logprobs))

    def unusable_version(self, version: int) -> int:
        """The label of a server that failed the check of `version`: outside the staleness bound now, and further
        out as the learner's version grows."""
        return version - self.max_staleness - 1

    def forget(self, url: str) -> None:
        self.verified.pop(url, None)
        self.failed_checks.pop(url, None)

    def give_up(self, urls: list[str], version: int) -> None:
        """Raise FleetUnverified when every server in `urls` has failed `give_up_after` checks of `version`."""
        counts = [self.failed_checks.get(u, (None, 0)) for u in urls]
        if urls and all(v == version and n >= self.give_up_after for v, n in counts):
            raise FleetUnverified(f"no vLLM server serves version {version} after {self.give_up_after} checks each "
                                  f"({', '.join(urls)}); see the WEIGHT PUSH NOT VERIFIED lines above (a gap that "
                                  "stays the same from version to version is the servers' precision, not their "
                                  "weights: vllm.weight_sync.verify_tolerance, learner/WEIGHT_SYNC.md)")

    async def verify(self, session: aiohttp.ClientSession, urls: list[str], expected: Expected) -> dict[str, str]:
        """Check every server in `urls` (each just took the push of `expected.version`); returns the failed ones,
        each with why, after counting, logging and relabelling them."""
        failed = {}
        for url in urls:  # one short request each; in order, so a server's log lines stay together
            reason = await self._check(session, url, expected)
            if reason is None:
                self._passed(url, expected.version)
            else:
                failed[url] = reason
                await self._failed(session, url, expected.version, reason)
        return failed

    async def _check(self, session: aiohttp.ClientSession, url: str, expected: Expected) -> str | None:
        try:
            # a salt per probe, not per version: a retried check must not read the KV cache its failed try left
            self.probes += 1
            served = await served_logprobs(session, url, expected.tokens, self.model,
                                           f"verify-v{expected.version}-{self.probes}")
        except WeightSyncError as exc:
            return f"the probe could not be scored: {exc}"
        c = compare(expected.logprobs, served, self.tolerance)
        if c.ok:
            return None
        if self.failed_checks.get(url, (None, 0))[0] != expected.version:  # once per version: what tells the cause
            log.error("weight sync: probe log-probs of version %d, learner %s, %s %s", expected.version,
                      [round(x, 5) for x in expected.logprobs], url, [round(x, 5) for x in served])
        return (f"serves other weights than version {expected.version}: mean |log-prob difference| {c.mean_abs:.3g} "
                f"over the probe's {len(served)} tokens (max {c.max_abs:.3g}) exceeds the tolerance {c.tolerance:g}")

    def _passed(self, url: str, version: int) -> None:
        if url in self.failed_checks:
            log.info("weight sync: %s verified at version %d; actors may use it again", url, version)
        self.failed_checks.pop(url, None)
        self.verified[url] = version
        if self.metrics is not None:
            self.metrics.verified_version.labels(url).set(version)

    async def _failed(self, session: aiohttp.ClientSession, url: str, version: int, reason: str) -> None:
        last, n = self.failed_checks.get(url, (version, 0))
        self.failed_checks[url] = (version, n + 1 if last == version else 1)
        if self.metrics is not None:
            self.metrics.verify_failures.labels(url).inc()
        label = self.unusable_version(version)
        try:
            await post(session, f"{url}/update_weight_version", {"new_version": str(label)})
            excluded = f"relabelled {label}, outside the staleness bound: actors skip it"
        except WeightSyncError as exc:  # down as well: actors skip it for that
            excluded = f"could not be relabelled ({exc})"
        log.error("WEIGHT PUSH NOT VERIFIED on %s: %s; %s until a later push verifies it", url, reason, excluded)
