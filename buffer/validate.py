"""What makes a turn chunk unacceptable in itself, checked over a whole TurnChunkBatch at once.

The codec has already checked types, dtypes and sizes, and chunk_batch.unpack that the batch's columns agree.
Token ids are unsigned on the wire, so none is negative; one beyond the vocabulary is the learner's to catch,
as only it knows the vocabulary. What a chunk means for its episode (a turn already there, an episode
closed) is the store's to decide.
"""
from __future__ import annotations

import numpy as np

from turnstream.protocol.messages import TurnChunk, TurnChunkBatch


def rejections(batch: TurnChunkBatch, chunks: list[TurnChunk]) -> list[str]:
    """Per chunk of `batch` (`chunks` are its unpacked chunks): "" if it is well formed, else a short reason
    (a metric label). A chunk that fails several checks is named by the first one below."""
    lp = batch.gen_logprobs
    checks = (
        ("negative_index", (batch.seq < 0) | (batch.turn < 0) | (batch.epoch < 0)),
        ("empty_prompt", (batch.turn == 0) & (batch.obs_len == 0)),
        # every log-prob finite and at most 0, with a little slack for rounding (NaN fails `<=`)
        ("bad_logprob", _any_per_chunk(~(lp <= 1e-4) | (lp == -np.inf), batch.gen_len)),
        ("bad_version", _any_per_chunk(batch.gen_versions < 0, batch.gen_len)),
        ("bad_scalar", ~np.isfinite(batch.reward) | ~np.isfinite(batch.temperature) | ~(batch.temperature > 0)),
        ("token_not_allowed", _outside_allowed(batch, chunks)),
    )
    reasons = [""] * len(chunks)
    for reason, failed in reversed(checks):
        for i in np.flatnonzero(failed).tolist():
            reasons[i] = reason
    return reasons


def _any_per_chunk(bad: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per chunk, whether any of its items is bad (the chunks' items end to end, `lengths` of them each)."""
    bad_before = np.concatenate(([0], np.cumsum(bad, dtype=np.int64)))
    ends = np.cumsum(lengths)
    return bad_before[ends] > bad_before[ends - lengths]


def _outside_allowed(batch: TurnChunkBatch, chunks: list[TurnChunk]) -> np.ndarray:
    """Per chunk, whether it generated a token outside its allowed-token mask (an empty mask allows all)."""
    failed = np.zeros(len(chunks), bool)
    for i in np.flatnonzero((batch.allowed_len > 0) & (batch.gen_len > 0)).tolist():
        failed[i] = not np.isin(chunks[i].gen_tokens, chunks[i].allowed_tokens).all()
    return failed

