"""Packing turn chunks of one actor epoch into their wire form, a TurnChunkBatch, and splitting one back.

One form for every chunk: a small chunk costs the buffer far more in per-message work (a receive, a header
to decode, an ack) than in bytes, so the chunks that queue up together travel as one message; a large chunk
travels as a batch of its own, its arrays sent and kept as they are, without a copy.
"""
from __future__ import annotations

import numpy as np

from turnstream.protocol.messages import TurnChunk, TurnChunkBatch

# per-chunk scalar columns and the dtypes they travel in
COLUMNS = {name: TurnChunkBatch.ARRAYS[name] for name in (
    "seq", "turn", "agent_id", "reward", "done", "truncated", "temperature", "t_start", "t_end")}
# concatenated token arrays, and which length column delimits each
TOKEN_ARRAYS = {"obs_tokens": "obs_len", "gen_tokens": "gen_len", "gen_logprobs": "gen_len",
                "gen_versions": "gen_len", "allowed_tokens": "allowed_len"}
LENGTHS = {"obs_len": "obs_tokens", "gen_len": "gen_tokens", "allowed_len": "allowed_tokens"}


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
    n = len(chunks)
    columns = {name: np.fromiter((getattr(c, name) for c in chunks), dtype, n) for name, dtype in COLUMNS.items()}
    lengths = {name: np.fromiter((getattr(c, array).size for c in chunks), np.int64, n)
               for name, array in LENGTHS.items()}
    arrays = {name: _joined([getattr(c, name) for c in chunks], np.dtype(TurnChunkBatch.ARRAYS[name]))
              for name in TOKEN_ARRAYS}
    return TurnChunkBatch(actor_id=first.actor_id, epoch=first.epoch,
                          episode_ids=[c.episode_id for c in chunks], prompt_keys=[c.prompt_key for c in chunks],
                          **columns, **lengths, **arrays)


def _joined(parts: list, dtype: np.dtype) -> np.ndarray:
    """The parts end to end, in `dtype`. Signed token ids become unsigned as a view of the same bytes: a
    negative id arrives as one no vocabulary holds, which the learner refuses. One part is not copied."""
    wire = []
    for part in parts:
        part = np.asarray(part)
        same_size_ints = part.dtype.kind in "iu" and dtype.kind in "iu" and part.dtype.itemsize == dtype.itemsize
        wire.append(part.view(dtype) if same_size_ints else part.astype(dtype, copy=False))
    return wire[0] if len(wire) == 1 else np.concatenate(wire)


def readable_seqs(batch: TurnChunkBatch) -> list[int]:
    """The seqs a malformed batch can still be acked by (empty if even they are unusable)."""
    return batch.seq.tolist() if batch.seq.ndim == 1 else []


def unpack(batch: TurnChunkBatch) -> list[TurnChunk]:
    """The batch's chunks. Raises BatchError if the columns disagree with each other. Where the batch holds
    several chunks each gets its own copy of its arrays: a kept chunk must not pin the whole message."""
    n = batch.seq.size
    if n == 0:
        raise BatchError("bad_batch", "empty batch")
    if any(getattr(batch, name).shape != (n,) for name in (*COLUMNS, *LENGTHS)):
        raise BatchError("bad_batch", "per-chunk columns differ in length")
    if len(batch.episode_ids) != n or len(batch.prompt_keys) != n:
        raise BatchError("bad_batch", "episode_ids/prompt_keys do not match the chunk count")
    if any(getattr(batch, name).ndim != 1 for name in TOKEN_ARRAYS):
        raise BatchError("bad_batch", "token arrays must be 1-D")
    offsets = {}
    for length_name, array_name in LENGTHS.items():
        lengths = getattr(batch, length_name)
        if lengths.min() < 0 or int(lengths.sum()) != getattr(batch, array_name).size:
            raise BatchError("bad_batch", f"{length_name} does not add up to {array_name}")
        offsets[length_name] = np.concatenate(([0], np.cumsum(lengths))).tolist()
    if not batch.gen_tokens.shape == batch.gen_logprobs.shape == batch.gen_versions.shape:
        raise BatchError("bad_batch", "gen_tokens, gen_logprobs and gen_versions differ in length")
    if n == 1:
        parts = [{name: getattr(batch, name) for name in TOKEN_ARRAYS}]
    else:
        parts = [{name: getattr(batch, name)[offsets[length][i]:offsets[length][i + 1]].copy()
                  for name, length in TOKEN_ARRAYS.items()} for i in range(n)]
    columns = {name: getattr(batch, name).tolist() for name in COLUMNS}
    return [TurnChunk(actor_id=batch.actor_id, epoch=batch.epoch, episode_id=batch.episode_ids[i],
                      prompt_key=batch.prompt_keys[i], **{name: values[i] for name, values in columns.items()},
                      **parts[i])
            for i in range(n)]
