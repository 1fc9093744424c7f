"""What makes a turn chunk unacceptable in itself, checked for every chunk of a TurnChunkBatch.

The codec has already checked types, dtypes and sizes, and chunk_batch.unpack that the batch's columns agree.
Token ids are unsigned on the wire, so none is negative; one beyond the vocabulary is the learner's to catch,
as only it knows the vocabulary. What a chunk means for its episode (a turn already there, an episode
closed) is the store's to decide.
"""
from __future__ import annotations

import math
from bisect import bisect_right
from itertools import accumulate

import numpy as np

from turnstream.protocol.messages import TurnChunk, TurnChunkBatch


def rejections(batch: TurnChunkBatch, chunks: list[TurnChunk]) -> list[str]:
    """Per chunk of `batch` (`chunks` are its unpacked chunks): "" if it is well formed, else a short reason
    (a metric label). A chunk that fails several checks is named by the first one below."""
    b, lp = batch, batch.gen_logprobs
    failing = {  # reason -> the chunks that fail its check
        "negative_index": {i for i, (seq, turn) in enumerate(zip(b.seq, b.turn)) if seq < 0 or turn < 0 or b.epoch < 0},
        "empty_prompt": {i for i, (turn, n_obs) in enumerate(zip(b.turn, b.obs_len)) if turn == 0 and n_obs == 0},
        # every log-prob finite and at most 0, with a little slack for rounding (NaN fails `<=`)
        "bad_logprob": _chunks_holding(np.flatnonzero(~((lp <= 1e-4) & (lp > -np.inf))), b.gen_len),
        "bad_version": _chunks_holding(np.flatnonzero(b.gen_versions < 0), b.gen_len),
        "bad_scalar": {i for i, (reward, temp) in enumerate(zip(b.reward, b.temperature))
                       if not (math.isfinite(reward) and math.isfinite(temp) and temp > 0)}
        | {i for i, c in enumerate(chunks) if not (0 < c.top_p <= 1 and c.top_k >= 0)}  # NaN fails `<`
        | {i for i, c in enumerate(chunks) if not -1 <= c.seed < 2**63},  # a seed vLLM takes, or -1: none
        "token_not_allowed": {i for i, (n_allowed, n_gen) in enumerate(zip(b.allowed_len, b.gen_len))
                              if n_allowed and n_gen and not _only_allowed(chunks[i])},
    }
    reasons = [""] * len(chunks)
    for reason, chunk_indices in reversed(failing.items()):
        for i in chunk_indices:
            reasons[i] = reason
    return reasons


def _only_allowed(c: TurnChunk) -> bool:
    return bool(np.isin(c.gen_tokens, c.allowed_tokens).all())


def _chunks_holding(positions: np.ndarray, lengths: list[int]) -> set[int]:
    """The chunks that hold these positions of the chunks' items end to end (`lengths` of them each)."""
    if not positions.size:
        return set()
    ends = list(accumulate(lengths))
    return {bisect_right(ends, p) for p in positions.tolist()}
