"""protocol.chunk_batch and buffer.validate: packing is lossless, a lone chunk travels without a copy, and
validating a batch gives each chunk the verdict it would get alone."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnstream.buffer.store.validate import rejections
from turnstream.protocol.chunk_batch import BatchError, pack, unpack
from turnstream.protocol.codec import decode, encode
from tests.unit.test_codec import assert_same_message, sample_turn_chunk


def _chunks(n: int):
    base = sample_turn_chunk()
    return [dataclasses.replace(base, seq=base.seq + i, episode_id=f"ep{i}", turn=i % 3,
                                obs_tokens=np.arange(i + 1, dtype=np.int32),
                                allowed_tokens=base.allowed_tokens if i % 2 else np.zeros(0, np.int32))
            for i in range(n)]


def test_pack_then_unpack_gives_back_every_chunk_through_the_codec():
    chunks = _chunks(7)
    back = unpack(decode([bytes(f) for f in encode(pack(chunks))]))
    assert len(back) == 7
    for a, b in zip(chunks, back):
        assert_same_message(a, b)


def test_unpacked_chunks_own_their_arrays():
    # a chunk kept in the buffer must not pin the whole received message in memory
    for c in unpack(pack(_chunks(3))):
        assert c.obs_tokens.base is None and c.gen_tokens.base is None


def test_a_lone_chunk_travels_as_a_view_of_its_arrays_token_ids_unsigned():
    chunk = sample_turn_chunk()
    batch = pack([chunk])
    for name in ("obs_tokens", "gen_tokens", "allowed_tokens"):
        assert getattr(batch, name).dtype == np.uint32
        assert np.shares_memory(getattr(batch, name), getattr(chunk, name)), name
    (back,) = unpack(batch)
    assert np.shares_memory(back.obs_tokens, chunk.obs_tokens)  # the whole message is this chunk's anyway


def test_chunks_of_two_actor_epochs_are_not_packed_together():
    a, b = _chunks(2)
    with pytest.raises(ValueError, match="one actor epoch"):
        pack([a, dataclasses.replace(b, epoch=a.epoch + 1)])


@pytest.mark.parametrize("corrupt, detail", [
    (lambda b: b.gen_len.__setitem__(0, b.gen_len[0] + 1), "gen_len"),
    (lambda b: setattr(b, "turn", b.turn[:-1]), "columns"),
    (lambda b: setattr(b, "episode_ids", b.episode_ids[:-1]), "columns"),
    (lambda b: setattr(b, "gen_logprobs", b.gen_logprobs[:-1]), "differ in length"),
    (lambda b: setattr(b, "seq", b.seq[:0]), "empty"),
])
def test_a_self_inconsistent_batch_is_refused_with_a_reason(corrupt, detail):
    batch = pack(_chunks(3))
    corrupt(batch)
    with pytest.raises(BatchError, match=detail) as err:
        unpack(batch)
    assert err.value.reason == "bad_batch"


def _perturbed(draw_kind: str, c):
    if draw_kind == "bad_logprob":
        c.gen_logprobs = np.full(c.gen_tokens.size, np.nan, np.float32)
    elif draw_kind == "bad_version":
        c.gen_versions = np.full(c.gen_tokens.size, -2, np.int32)
    elif draw_kind == "bad_scalar":
        c.temperature = 0.0
    elif draw_kind == "empty_prompt":
        c.turn, c.obs_tokens = 0, np.zeros(0, np.int32)
    elif draw_kind == "token_not_allowed":
        c.allowed_tokens = np.array([999], np.int32)
    elif draw_kind == "negative_index":
        c.turn = -1
    elif draw_kind == "two_faults":
        c.turn, c.reward = -1, float("inf")
    return c


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(st.lists(st.sampled_from(["ok", "ok", "ok", "bad_logprob", "bad_version", "bad_scalar", "empty_prompt",
                                 "token_not_allowed", "negative_index", "two_faults"]), min_size=1, max_size=6))
def test_each_chunk_of_a_batch_gets_the_verdict_it_gets_alone(kinds):
    chunks = [_perturbed(kind, c) for kind, c in zip(kinds, _chunks(len(kinds)))]
    batch = pack(chunks)
    alone = [rejections(pack([c]), [c])[0] for c in chunks]
    assert rejections(batch, unpack(batch)) == alone
    assert [reason or "ok" for reason in alone] == [{"two_faults": "negative_index"}.get(k, k) for k in kinds]
