"""vLLM's per-request sampling seeds, one per generate request, so that every turn can be sampled again.

A seed must differ between every two requests of a run: vLLM's noise is a function of the seed (and the step), so
two requests with one seed, say two episodes of one task, would sample alike. A stream is keyed by the run's seed
and the identity of what draws from it (actor, incarnation, fleet), so distinct streams do not repeat each other
and one identity draws the same sequence again.
"""
from __future__ import annotations

import hashlib
import random
import secrets

SEED_LIMIT = 2**63  # vLLM takes any int64; -1 is its "no seed", which the turn chunks use for "unknown"


class RequestSeeds:
    def __init__(self, run_seed: int, *identity: str | int):
        key = hashlib.sha256(repr((run_seed, identity)).encode()).digest()
        self._rng = random.Random(key)

    @classmethod
    def unpredictable(cls) -> RequestSeeds:
        """A stream no other shares, for a fleet that was given none."""
        return cls(secrets.randbits(64), "unkeyed")

    def draw(self) -> int:
        return self._rng.randrange(SEED_LIMIT)
