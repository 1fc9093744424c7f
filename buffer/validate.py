"""Semantic checks on a decoded turn chunk (the codec already checked types, dtypes and sizes)."""
from __future__ import annotations

import math

import numpy as np

from turnstream.buffer.episodes import Episode
from turnstream.protocol.messages import TurnChunk, TurnChunkBatch


def validate_chunk(c: TurnChunk) -> str:
    """Empty string if the chunk is well formed, else a short reason (a metric label)."""
    n = c.gen_tokens.size
    if c.gen_tokens.ndim != 1 or c.obs_tokens.ndim != 1 or c.allowed_tokens.ndim != 1:
        return "bad_shape"
    if c.gen_logprobs.shape != (n,) or c.gen_versions.shape != (n,):
        return "length_mismatch"
    if c.turn < 0 or c.seq < 0 or c.epoch < 0:
        return "negative_index"
    if c.turn == 0 and c.obs_tokens.size == 0:
        return "empty_prompt"
    if _negative(c.gen_tokens) or _negative(c.obs_tokens) or _negative(c.allowed_tokens):
        return "negative_token"
    if n and not _logprobs_ok(c.gen_logprobs):
        return "bad_logprob"
    if n and c.gen_versions.min() < 0:
        return "bad_version"
    if not math.isfinite(c.reward) or not (c.temperature > 0 and math.isfinite(c.temperature)):
        return "bad_scalar"
    if c.allowed_tokens.size and n and not np.isin(c.gen_tokens, c.allowed_tokens).all():
        return "token_not_allowed"
    return ""


def _negative(tokens: np.ndarray) -> bool:
    """A negative id among signed tokens. Unsigned ones (protocol.messages.UNSIGNED_TOKENS) cannot be, and need
    no pass over them; an id beyond the vocabulary is the learner's to catch, as only it knows the vocabulary."""
    return tokens.dtype.kind == "i" and tokens.size > 0 and tokens.min() < 0


def _logprobs_ok(logprobs: np.ndarray) -> bool:
    """Every log-prob finite and at most 0 (a little slack for rounding). Two reductions and no temporary:
    NaN propagates through max, so it fails the first test; -inf fails the second."""
    return bool(logprobs.max() <= 1e-4 and logprobs.min() > -math.inf)


def beyond_final_turn(ep: Episode, c: TurnChunk) -> bool:
    """A turn after the one marked done, or a done marker before turns already received."""
    if ep.last_turn is not None and c.turn > ep.last_turn:
        return True
    return c.done and any(t > c.turn for t in ep.turns)


def batch_is_clean(b: TurnChunkBatch) -> bool:
    """True if every chunk of an unpacked batch passes validate_chunk, except possibly the allowed-token
    check (done per chunk, and only for chunks that carry a mask). One vectorised pass over the whole
    batch instead of a dozen small numpy reductions per chunk; False sends the caller to validate_chunk."""
    if b.epoch < 0 or b.seq.min() < 0 or b.turn.min() < 0:
        return False
    if ((b.turn == 0) & (b.obs_len == 0)).any():
        return False
    if _negative(b.obs_tokens) or _negative(b.gen_tokens) or _negative(b.allowed_tokens):
        return False
    if b.gen_logprobs.size and not _logprobs_ok(b.gen_logprobs):
        return False
    if b.gen_versions.size and b.gen_versions.min() < 0:
        return False
    return bool(np.isfinite(b.reward).all() and np.isfinite(b.temperature).all() and (b.temperature > 0).all())
