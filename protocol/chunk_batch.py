"""Packing turn chunks of one actor epoch into their wire form, a TurnChunkBatch, and splitting one back.

One form for every chunk: a small chunk costs the buffer far more in per-message work (a receive, a header
to decode, an ack) than in bytes, so the chunks that queue up together travel as one message; a large chunk
travels as a batch of its own, its arrays sent and kept as they are, without a copy.
"""
from __future__ import annotations

from itertools import accumulate
from operator import attrgetter

import numpy as np

from turnstream.protocol.messages import TurnChunk, TurnChunkBatch

# per-chunk scalars, and the Python type each travels as in the header
COLUMNS = {"seq": int, "turn": int, "agent_id": int, "reward": float, "done": bool, "truncated": bool,
           "temperature": float, "t_start": float, "t_end": float}
# concatenated token arrays, and which length list delimits each
TOKEN_ARRAYS = {"obs_tokens": "obs_len", "gen_tokens": "gen_len", "gen_logprobs": "gen_len",
                "gen_versions": "gen_len", "allowed_tokens": "allowed_len"}
LENGTHS = {"obs_len": "obs_tokens", "gen_len": "gen_tokens", "allowed_len": "allowed_tokens"}
# per-chunk scalars a batch may leave empty, and the value each chunk then takes
OPTIONAL_COLUMNS = {"context_reset": False, "top_p": 1.0, "top_k": 0, "seed": -1}


class BatchError(ValueError):
    """The batch is not self-consistent; `reason` is a short metric label."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def chunk_nbytes(chunk: TurnChunk) -> int:
    return 4 * (chunk.obs_tokens.size + 3 * chunk.gen_tokens.size + chunk.allowed_tokens.size)


def pack(chunks: list[TurnChunk]) -> TurnChunkBatch:
    first = chunks[0]
    if any(c.actor_id != first.actor_id or c.epoch != first.epoch for c in chunks):
        raise ValueError("a batch carries chunks of one actor epoch only")
    rows = zip(*map(_column_values, chunks))  # one tuple per column
    columns = {name: list(map(kind, values)) for (name, kind), values in zip(COLUMNS.items(), rows)}
    lengths = {name: [getattr(c, array).size for c in chunks] for name, array in LENGTHS.items()}
    arrays = {name: _joined([getattr(c, name) for c in chunks], _WIRE_DTYPES[name]) for name in TOKEN_ARRAYS}
    # else these lists stay empty: nothing to say
    truncated = any(c.top_p < 1 or c.top_k > 0 for c in chunks)
    seeded = any(c.seed >= 0 for c in chunks)
    return TurnChunkBatch(actor_id=first.actor_id, epoch=int(first.epoch),
                          episode_ids=[c.episode_id for c in chunks], prompt_keys=[c.prompt_key for c in chunks],
                          context_reset=[bool(c.context_reset) for c in chunks],
                          top_p=[float(c.top_p) for c in chunks] if truncated else [],
                          top_k=[int(c.top_k) for c in chunks] if truncated else [],
                          seed=[int(c.seed) for c in chunks] if seeded else [], **columns, **lengths, **arrays)


_column_values = attrgetter(*COLUMNS)
_WIRE_DTYPES = {name: np.dtype(TurnChunkBatch.ARRAYS[name]) for name in TOKEN_ARRAYS}


def _joined(parts: list, dtype: np.dtype) -> np.ndarray:
    """The parts end to end, in `dtype`. Signed token ids become unsigned as a view of the same bytes: a
    negative id arrives as one no vocabulary holds, which the learner refuses. One part is not copied."""
    joined = np.asarray(parts[0]) if len(parts) == 1 else np.concatenate(parts)
    if joined.dtype.kind in "iu" and dtype.kind in "iu" and joined.dtype.itemsize == dtype.itemsize:
        return joined.view(dtype)
    return joined.astype(dtype, copy=False)


def unpack(batch: TurnChunkBatch) -> list[TurnChunk]:
    """The batch's chunks. Raises BatchError if its columns disagree with each other. Where the batch holds
    several chunks each gets its own copy of its arrays: a kept chunk must not pin the whole message."""
    n = len(batch.seq)
    if n == 0:
        raise BatchError("bad_batch", "empty batch")
    if any(len(getattr(batch, name)) != n for name in (*COLUMNS, *LENGTHS, "episode_ids", "prompt_keys")):
        raise BatchError("bad_batch", "per-chunk columns differ in length")
    for name in OPTIONAL_COLUMNS:  # empty: a peer that never restarts a context, never truncates, never seeds
        if len(getattr(batch, name)) not in (0, n):
            raise BatchError("bad_batch", f"{name} has neither one entry per chunk nor none")
    if any(getattr(batch, name).ndim != 1 for name in TOKEN_ARRAYS):
        raise BatchError("bad_batch", "token arrays must be 1-D")
    offsets = {}
    for length_name, array_name in LENGTHS.items():
        lengths = getattr(batch, length_name)
        if min(lengths) < 0 or sum(lengths) != getattr(batch, array_name).size:
            raise BatchError("bad_batch", f"{length_name} does not add up to {array_name}")
        offsets[length_name] = [0, *accumulate(lengths)]
    if not batch.gen_tokens.shape == batch.gen_logprobs.shape == batch.gen_versions.shape:
        raise BatchError("bad_batch", "gen_tokens, gen_logprobs and gen_versions differ in length")
    if n == 1:
        parts = [{name: getattr(batch, name) for name in TOKEN_ARRAYS}]
    else:
        parts = [{name: getattr(batch, name)[offsets[length][i]:offsets[length][i + 1]].copy()
                  for name, length in TOKEN_ARRAYS.items()} for i in range(n)]
    columns = {name: getattr(batch, name) for name in COLUMNS}
    optional = {name: getattr(batch, name) or [default] * n for name, default in OPTIONAL_COLUMNS.items()}
    return [TurnChunk(actor_id=batch.actor_id, epoch=batch.epoch, episode_id=batch.episode_ids[i],
                      prompt_key=batch.prompt_keys[i], **{name: values[i] for name, values in columns.items()},
                      **parts[i], **{name: values[i] for name, values in optional.items()})
            for i in range(n)]
