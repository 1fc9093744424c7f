"""Stand-ins for the vLLM fleet and the buffer link, for runner tests without servers."""
from __future__ import annotations

import asyncio
import random

from turnstream.actors.inference.client import Generation


class ScriptedClient:
    """Samples uniformly from the allowed tokens (or returns `free_tokens`); records every context it saw."""

    def __init__(self, seed: int = 0, free_tokens: list[int] | None = None, version: int = 0):
        self.rng = random.Random(seed)
        self.free_tokens = free_tokens or [60, 61]
        self.version = version
        self.calls: list[list[int]] = []

    async def generate(self, token_ids, *, max_tokens, temperature, allowed_token_ids=None, cache_salt=None,
                       top_p=1.0, top_k=0):
        self.calls.append(list(token_ids))
        await asyncio.sleep(0)
        tokens = [self.rng.choice(allowed_token_ids)] if allowed_token_ids else self.free_tokens[:max_tokens]
        return Generation(tokens, [-0.5] * len(tokens), [self.version] * len(tokens), "length")


class CollectingLink:
    learner_version = 0

    def __init__(self, credits: int = 10**9):
        self.chunks = []
        self.credits = credits
        self.slots = 0  # what the runner last asked credits for

    def want_slots(self, slots):
        self.slots = slots

    async def send(self, chunk):
        chunk.seq = len(self.chunks)
        self.chunks.append(chunk)

    async def acquire_credit(self):
        if self.credits <= 0:
            await asyncio.Event().wait()  # no more credits: park the slot
        self.credits -= 1
        return ""

    async def return_credit(self, server_id):
        self.credits += 1

    async def delivered(self, seq):
        return None  # every chunk is held as soon as it is sent


def streams(chunks) -> dict[str, list]:
    out: dict[str, list] = {}
    for c in chunks:
        out.setdefault(c.episode_id, []).append(c)
    return out
