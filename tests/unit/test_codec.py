"""protocol.codec: round trips of every message type, and decode's promise to fail only with DecodeError."""
from __future__ import annotations

import copy
import dataclasses
import pickle
import random

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnstream.protocol import PROTOCOL_VERSION
from turnstream.protocol.chunk_batch import pack, unpack
from turnstream.protocol.codec import DecodeError, decode, encode
from turnstream.protocol.messages import (MESSAGE_TYPES, AckBatch, Batch, BatchRequest, CreditGrant, CreditRequest,
                                          TurnChunk, TurnChunkBatch, VersionAnnouncement)

FUZZ = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])


def sample_turn_chunk() -> TurnChunk:
    return TurnChunk(
        actor_id="actor-3", epoch=2, seq=17, episode_id="ep-abc", turn=1, prompt_key="goal_walk/5",
        obs_tokens=np.array([5, 6, 7], np.int32), gen_tokens=np.array([8, 9], np.int32),
        gen_logprobs=np.array([-0.25, -1.5], np.float32), gen_versions=np.array([3, 4], np.int32),
        reward=0.75, done=True, agent_id=1, temperature=0.7, allowed_tokens=np.array([8, 9, 10], np.int32),
        truncated=True, t_start=1700000000.25, t_end=1700000001.5,
    )


def sample_batch() -> Batch:
    return Batch(
        request_id=9, learner_version=12, episode_ids=["e1", "e2"], prompt_keys=["p1", "p2"], returns=[1.0, 0.0],
        tokens=np.array([1, 2, 3, 4, 5, 6], np.int32), action_mask=np.array([0, 1, 1, 0, 0, 1], np.uint8),
        behav_logprobs=np.array([0, -0.5, -0.1, 0, 0, -2.0], np.float32),
        versions=np.array([-1, 11, 12, -1, -1, 10], np.int32), turn_index=np.array([0, 0, 0, 0, 0, 0], np.int32),
        temperature=np.full(6, 0.9, np.float32), mask_id=np.array([0, 0, 0, -1, -1, -1], np.int32),
        episode_offsets=np.array([0, 3, 6], np.int64), allowed_sets=[[2, 3], [7]], dropped_stale=4,
    )


def sample_turn_chunks() -> TurnChunkBatch:
    second = dataclasses.replace(sample_turn_chunk(), seq=18, episode_id="ep-def", turn=0, done=False,
                                 allowed_tokens=np.zeros(0, np.int32), gen_tokens=np.array([4], np.int32),
                                 gen_logprobs=np.array([-0.5], np.float32), gen_versions=np.array([4], np.int32))
    return pack([sample_turn_chunk(), second])


SAMPLES = {
    "turn_chunks": sample_turn_chunks,
    "acks": lambda: AckBatch(seq=np.array([5, 6, 7], np.int64), status=np.array([0, 2, 1], np.uint8),
                             reasons=["episode_closed"]),
    "credit_request": lambda: CreditRequest(actor_id="actor-0", epoch=1, slots=64),
    "credit_grant": lambda: CreditGrant(credits=3, learner_version=7),
    "batch_request": lambda: BatchRequest(request_id=4, learner_version=2, max_episodes=128),
    "batch": sample_batch,
    "version": lambda: VersionAnnouncement(version=5, weights_path="/tmp/weights/v000005"),
}


def test_samples_cover_every_message_type():
    assert set(SAMPLES) == set(MESSAGE_TYPES)


def assert_same_message(a, b):
    """b is a (a message, or a turn chunk) as it arrives: the same values, arrays in their wire dtypes."""
    assert type(a) is type(b)
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert isinstance(y, np.ndarray), f.name
            if f.name in getattr(a, "ARRAYS", {}):
                assert y.dtype == a.ARRAYS[f.name], f.name
            assert y.shape == x.shape, f.name
            np.testing.assert_array_equal(y, x, err_msg=f.name)
        else:
            assert y == x, f.name
            assert type(y) is type(x), f.name


@pytest.mark.parametrize("type_name", sorted(MESSAGE_TYPES))
def test_round_trip(type_name):
    msg = SAMPLES[type_name]()
    frames = encode(msg)
    assert len(frames) == 1 + len(msg.ARRAYS)
    assert_same_message(msg, decode(frames))


@pytest.mark.parametrize("type_name", sorted(MESSAGE_TYPES))
def test_round_trip_through_copied_bytes(type_name):
    """What arrives from a socket is plain bytes, not the sender's memoryviews."""
    msg = SAMPLES[type_name]()
    assert_same_message(msg, decode([bytes(f) for f in encode(msg)]))


def test_a_chunk_with_defaults_and_empty_arrays_arrives_whole():
    msg = TurnChunk(actor_id="a", epoch=0, seq=0, episode_id="e", turn=0, prompt_key="p",
                    obs_tokens=np.array([1], np.int32), gen_tokens=np.zeros(0, np.int32),
                    gen_logprobs=np.zeros(0, np.float32), gen_versions=np.zeros(0, np.int32), reward=0.0, done=False)
    (out,) = unpack(decode(encode(pack([msg]))))
    assert_same_message(msg, out)
    assert out.allowed_tokens.size == 0 and out.temperature == 1.0 and out.agent_id == 0


def test_token_ids_travel_as_uint32():
    header = header_of(encode(sample_turn_chunks()))
    assert {name: header["a"][name][0] for name in ("obs_tokens", "gen_tokens", "allowed_tokens")} == \
        dict.fromkeys(("obs_tokens", "gen_tokens", "allowed_tokens"), "<u4")


def test_encode_casts_arrays_to_the_declared_dtype():
    msg = sample_turn_chunks()
    msg.gen_versions = msg.gen_versions.astype(np.int64)
    msg.gen_logprobs = msg.gen_logprobs.astype(np.float64)
    out = decode(encode(msg))
    assert out.gen_versions.dtype == np.int32 and out.gen_logprobs.dtype == np.float32
    np.testing.assert_array_equal(out.gen_versions, [3, 4, 4])
    np.testing.assert_array_equal(out.gen_logprobs, np.array([-0.25, -1.5, -0.5], np.float32))


def test_integer_valued_float_field_decodes_as_float():
    frames = with_header(encode(BatchRequest(1, 0, 4, timeout_s=1.5)), lambda h: h["f"].__setitem__("timeout_s", 1))
    out = decode(frames)
    assert out.timeout_s == 1.0 and type(out.timeout_s) is float


def test_scalar_fields_in_another_order_decode_the_same():
    msg = sample_turn_chunks()
    reordered = with_header(encode(msg), lambda h: h.__setitem__("f", dict(reversed(list(h["f"].items())))))
    assert_same_message(msg, decode(reordered))


def test_zmq_frames_are_decoded_in_place():
    """The server passes zmq.Frame objects (received with copy=False); decode reads their buffers without a
    copy, so the decoded arrays are views of the frames."""
    import zmq

    msg = sample_batch()
    frames = [zmq.Frame(bytes(f)) for f in encode(msg)]
    out = decode(frames)
    assert_same_message(msg, out)
    assert not out.tokens.flags.owndata
    # and hold the frame itself, no memoryview in between: a buffer keeps these arrays, and the three objects
    # a memoryview adds per array were half of what decode kept per 1 MB chunk
    assert any(out.tokens.base is frame for frame in frames[1:])


def test_unknown_extra_scalar_field_is_ignored():
    """Forward compatibility: a newer peer's optional scalar field must not break an older decoder."""
    frames = with_header(encode(CreditRequest("a", 1, 2)), lambda h: h["f"].__setitem__("new_field", 3))
    assert decode(frames) == CreditRequest("a", 1, 2)


# ---- helpers for hand-made bad messages ----------------------------------------------------------

def header_of(frames) -> dict:
    return msgpack.unpackb(bytes(frames[0]), raw=False)


def with_header(frames, mutate) -> list:
    h = header_of(frames)
    mutate(h)
    return [msgpack.packb(h), *[bytes(f) for f in frames[1:]]]


def reason_of(frames, **kw) -> str:
    with pytest.raises(DecodeError) as info:
        decode(frames, **kw)
    return info.value.reason


def chunk_frames() -> list:
    return [bytes(f) for f in encode(sample_turn_chunks())]


# ---- rejections --------------------------------------------------------------------------------------

def test_empty_frame_list():
    assert reason_of([]) == "empty"


@pytest.mark.parametrize("garbage", [b"", b"\xc1", b"\x92\x01", b"\xde\xad\xbe\xef" * 4, b"\x81\xa1v"])
def test_header_not_msgpack(garbage):
    assert reason_of([garbage]) == "bad_header"


@pytest.mark.parametrize("value", [[1, 2], 5, "turn_chunks", None, b"raw"])
def test_header_not_a_map(value):
    assert reason_of([msgpack.packb(value)]) == "bad_header"


@pytest.mark.parametrize("version", [1, 3, 0, None, "2", 2.0])
def test_unknown_version(version):
    frames = with_header(chunk_frames(), lambda h: h.__setitem__("v", version))
    assert reason_of(frames) == "unknown_version"


def test_missing_version():
    frames = with_header(chunk_frames(), lambda h: h.pop("v"))
    assert reason_of(frames) == "unknown_version"


@pytest.mark.parametrize("type_name", ["nope", "", None, 3, "TurnChunkBatch", "turn_chunk", "ack"])
def test_unknown_type(type_name):
    frames = with_header(chunk_frames(), lambda h: h.__setitem__("t", type_name))
    assert reason_of(frames) == "unknown_type"


@pytest.mark.parametrize("type_name", [["turn_chunks"], {"x": 1}])
def test_unhashable_type_is_a_decode_error(type_name):
    """A header whose "t" is a list or map must be rejected, not crash the receiver with TypeError."""
    frames = with_header(chunk_frames(), lambda h: h.__setitem__("t", type_name))
    assert reason_of(frames) == "unknown_type"


@pytest.mark.parametrize("key,value", [("f", [1]), ("a", "x"), ("f", None), ("a", None)])
def test_scalar_and_array_sections_must_be_maps(key, value):
    frames = with_header(chunk_frames(), lambda h: h.__setitem__(key, value))
    assert reason_of(frames) == "bad_header"


def test_frame_count_mismatch_missing_frame():
    assert reason_of(chunk_frames()[:-1]) == "frame_count"


def test_frame_count_mismatch_extra_frame():
    assert reason_of(chunk_frames() + [b"\x00" * 4]) == "frame_count"


def test_frame_count_mismatch_header_only():
    assert reason_of(chunk_frames()[:1]) == "frame_count"


def test_truncated_array_frame():
    frames = chunk_frames()
    frames[1] = frames[1][:-1]  # seq loses a byte
    assert reason_of(frames) == "truncated"


def test_array_frame_too_long():
    frames = chunk_frames()
    frames[2] = frames[2] + b"\x00\x00\x00\x00"  # turn has one int32 more than its shape says
    assert reason_of(frames) == "truncated"


def test_shape_disagrees_with_frame():
    frames = with_header(chunk_frames(), lambda h: h["a"]["obs_tokens"].__setitem__(1, [2]))
    assert reason_of(frames) == "truncated"


@pytest.mark.parametrize("dtype", ["<f4", "<i8", "<i4", ">i4", ">u4", "<u8", "|O", "<U1", "uint32"])
def test_wrong_dtype(dtype):
    frames = with_header(chunk_frames(), lambda h: h["a"]["obs_tokens"].__setitem__(0, dtype))
    assert reason_of(frames) == "bad_dtype"


def test_uint32_is_refused_where_no_field_allows_it():
    frames = with_header(chunk_frames(), lambda h: h["a"]["gen_versions"].__setitem__(0, "<u4"))
    assert reason_of(frames) == "bad_dtype"


def test_unparseable_dtype():
    frames = with_header(chunk_frames(), lambda h: h["a"]["obs_tokens"].__setitem__(0, "not-a-dtype"))
    assert reason_of(frames) == "bad_dtype"


@pytest.mark.parametrize("spec", [["<i4"], "<i4", [3, [3]], ["<i4", 3], ["<i4", [-1]], ["<i4", [1.5]]])
def test_bad_array_spec(spec):
    frames = with_header(chunk_frames(), lambda h: h["a"].__setitem__("obs_tokens", spec))
    assert reason_of(frames) == "bad_array_spec"


def test_unknown_array_name():
    def mutate(h):
        h["a"] = {("nope" if k == "obs_tokens" else k): v for k, v in h["a"].items()}

    assert reason_of(with_header(chunk_frames(), mutate)) == "unknown_array"


def test_shape_with_more_dimensions_than_numpy_supports():
    """65 dimensions of size 1 hold one element; numpy cannot build such an array, decode must say so cleanly."""
    frames = with_header(chunk_frames(), lambda h: h["a"]["obs_tokens"].__setitem__(1, [1] * 65))
    frames[1] = frames[1][:4]
    assert reason_of(frames) in {"bad_array_spec", "truncated"}


@pytest.mark.parametrize("shape,frame", [
    ([2 ** 32, 2 ** 32], b""),  # 2**64 elements: an int64 product wraps to 0 and matches an empty frame
    ([3, 6148914691236517206], b"\x01\x00\x00\x00\x02\x00\x00\x00"),  # 2**64 + 2 wraps to 2 int32s
    ([2 ** 63 + 1, 2], b""),
])
def test_shape_whose_element_count_overflows_int64(shape, frame):
    frames = with_header(chunk_frames(), lambda h: h["a"]["obs_tokens"].__setitem__(1, shape))
    frames[1] = frame
    assert reason_of(frames) in {"bad_array_spec", "truncated"}


def test_oversized():
    frames = chunk_frames()
    total = sum(len(f) for f in frames)
    assert reason_of(frames, max_bytes=total - 1) == "oversized"
    assert isinstance(decode(frames, max_bytes=total), TurnChunkBatch)


def test_oversized_is_checked_before_parsing():
    assert reason_of([b"\xc1" * 100], max_bytes=10) == "oversized"


@pytest.mark.parametrize("name", ["actor_id", "epoch", "episode_ids", "prompt_keys"])
def test_missing_required_scalar(name):
    frames = with_header(chunk_frames(), lambda h: h["f"].pop(name))
    assert reason_of(frames) == "missing_field"


def test_missing_required_array():
    frames = chunk_frames()
    h = header_of(frames)
    names = list(h["a"])
    i = names.index("gen_logprobs")
    del h["a"]["gen_logprobs"]
    frames = [msgpack.packb(h)] + [f for j, f in enumerate(frames[1:]) if j != i]
    assert reason_of(frames) == "missing_field"


def test_a_batch_from_a_buffer_without_per_turn_fields_still_decodes():
    frames = [bytes(f) for f in encode(sample_batch())]
    h = header_of(frames)
    names = list(h["a"])
    added = ("agent_ids", "truncated", "turn_rewards", "turn_offsets")
    for name in added:
        del h["a"][name]
    out = decode([msgpack.packb(h)] + [f for j, f in enumerate(frames[1:]) if names[j] not in added])
    assert out.agent_ids.size == out.truncated.size == out.turn_rewards.size == out.turn_offsets.size == 0
    assert out.episode_ids == ["e1", "e2"]


@pytest.mark.parametrize("name,value", [
    ("epoch", "17"), ("epoch", 1.0), ("epoch", True), ("epoch", None), ("actor_id", 3), ("actor_id", b"actor"),
    ("episode_ids", ["e1", 2]), ("episode_ids", "e1"), ("prompt_keys", None),
])
def test_wrong_scalar_type_turn_chunks(name, value):
    frames = with_header(chunk_frames(), lambda h: h["f"].__setitem__(name, value))
    assert reason_of(frames) == "bad_field"


@pytest.mark.parametrize("name,value", [("timeout_s", "1.0"), ("timeout_s", True), ("max_tokens", 1.0),
                                        ("max_episodes", False)])
def test_wrong_scalar_type_batch_request(name, value):
    frames = with_header(encode(BatchRequest(1, 0, 4)), lambda h: h["f"].__setitem__(name, value))
    assert reason_of(frames) == "bad_field"


@pytest.mark.parametrize("name,value", [
    ("episode_ids", ["e1", 2]), ("episode_ids", "e1"), ("returns", [1.0, "x"]), ("returns", [True, 0.0]),
    ("allowed_sets", [[1, 2], ["3"]]), ("allowed_sets", [1, 2]), ("dropped_stale", 1.5),
])
def test_wrong_scalar_type_batch(name, value):
    frames = with_header([bytes(f) for f in encode(sample_batch())], lambda h: h["f"].__setitem__(name, value))
    assert reason_of(frames) == "bad_field"


# ---- never pickle ------------------------------------------------------------------------------------

@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickled_header_is_rejected(protocol):
    header = {"v": PROTOCOL_VERSION, "t": "credit_request", "f": {"actor_id": "a", "epoch": 1, "slots": 2}, "a": {}}
    assert reason_of([pickle.dumps(header, protocol=protocol)]) == "bad_header"


def test_pickled_message_object_is_rejected():
    assert reason_of([pickle.dumps(CreditRequest("a", 1, 2))]) == "bad_header"


@pytest.mark.parametrize("slot,expected", [("v", "unknown_version"), ("t", "unknown_type"), ("f", "bad_header"),
                                           ("a", "bad_header")])
def test_pickled_payload_inside_header_is_not_unpickled(slot, expected, monkeypatch):
    payload = pickle.dumps(CreditRequest("a", 1, 2))
    calls = []
    monkeypatch.setattr(pickle, "loads", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(pickle, "load", lambda *a, **k: calls.append(a))
    frames = with_header([bytes(f) for f in encode(CreditRequest("a", 1, 2))], lambda h: h.__setitem__(slot, payload))
    assert reason_of(frames) == expected
    assert calls == []


def test_pickled_scalar_field_is_a_bad_field_not_an_object():
    payload = pickle.dumps(("evil", 1))
    frames = with_header(chunk_frames(), lambda h: h["f"].__setitem__("actor_id", payload))
    assert reason_of(frames) == "bad_field"


def test_object_dtype_array_is_rejected():
    frames = with_header(chunk_frames(), lambda h: h["a"]["obs_tokens"].__setitem__(0, "|O"))
    frames[1] = pickle.dumps([1, 2, 3])
    assert reason_of(frames) in {"bad_dtype", "truncated"}


def test_encode_does_not_fall_back_to_pickle():
    """A scalar msgpack cannot represent must fail to encode, never be pickled into the header."""
    with pytest.raises(TypeError):
        encode(CreditRequest(actor_id=object(), epoch=1, slots=2))  # type: ignore[arg-type]


@pytest.mark.parametrize("type_name", sorted(MESSAGE_TYPES))
def test_round_trip_never_touches_pickle(type_name, monkeypatch):
    def forbidden(*a, **k):
        raise AssertionError("pickle used")

    for name in ("loads", "load", "dumps", "dump"):
        monkeypatch.setattr(pickle, name, forbidden)
    msg = SAMPLES[type_name]()
    assert_same_message(msg, decode(encode(msg)))


def test_header_is_plain_msgpack_of_plain_types():
    for make in SAMPLES.values():
        h = header_of(encode(make()))
        assert set(h) == {"v", "t", "f", "a"}

        def plain(x):
            if isinstance(x, dict):
                return all(isinstance(k, str) and plain(v) for k, v in x.items())
            if isinstance(x, list):
                return all(plain(v) for v in x)
            return isinstance(x, (str, int, float, bool)) or x is None

        assert plain(h)


# ---- fuzzing: only DecodeError, ever ----------------------------------------------------------------------

def decode_or_decode_error(frames) -> None:
    try:
        decode(frames, max_bytes=1 << 20)
    except DecodeError as exc:
        assert isinstance(exc.reason, str) and exc.reason
    # anything else propagates and fails the test


@FUZZ
@given(st.lists(st.binary(max_size=64), min_size=1, max_size=6))
def test_random_frames_raise_only_decode_error(frames):
    decode_or_decode_error(frames)


@FUZZ
@given(st.data())
def test_mutated_valid_message_raises_only_decode_error(data):
    make = data.draw(st.sampled_from(sorted(SAMPLES)))
    frames = [bytearray(bytes(f)) for f in encode(SAMPLES[make]())]
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(frames) - 1))
        op = data.draw(st.sampled_from(["flip", "truncate", "extend", "drop_frame", "dup_frame", "insert"]))
        f = frames[i]
        if op == "flip" and f:
            j = data.draw(st.integers(0, len(f) - 1))
            f[j] = data.draw(st.integers(0, 255))
        elif op == "truncate":
            del f[data.draw(st.integers(0, len(f))):]
        elif op == "extend":
            f.extend(data.draw(st.binary(min_size=1, max_size=8)))
        elif op == "insert":
            j = data.draw(st.integers(0, len(f)))
            f[j:j] = data.draw(st.binary(min_size=1, max_size=4))
        elif op == "drop_frame" and len(frames) > 1:
            frames.pop(i)
        elif op == "dup_frame":
            frames.insert(i, bytearray(f))
    decode_or_decode_error([bytes(f) for f in frames])


def test_seeded_byte_flips_of_every_message_raise_only_decode_error():
    rng = random.Random(1234)
    for make in SAMPLES.values():
        base = [bytes(f) for f in encode(make())]
        for _ in range(100):
            frames = [bytearray(f) for f in base]
            for _ in range(rng.randint(1, 3)):
                f = frames[rng.randrange(len(frames))]
                if f:
                    f[rng.randrange(len(f))] = rng.randrange(256)
            decode_or_decode_error([bytes(f) for f in frames])


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2 ** 63), 2 ** 64 - 1) | st.floats(allow_nan=True)
    | st.text(max_size=8) | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@FUZZ
@given(st.data())
def test_structurally_mutated_header_raises_only_decode_error(data):
    """Replace one part of a valid header with an arbitrary msgpack value; decode may only raise DecodeError."""
    make = data.draw(st.sampled_from(sorted(SAMPLES)))
    frames = [bytes(f) for f in encode(SAMPLES[make]())]
    h = header_of(frames)
    h2 = copy.deepcopy(h)
    slot = data.draw(st.sampled_from(["v", "t", "f", "a", "field", "array_spec", "shape"]))
    value = data.draw(msgpack_values)
    if slot in ("v", "t", "f", "a"):
        h2[slot] = value
    elif slot == "field":
        h2["f"][data.draw(st.sampled_from(sorted(h["f"])))] = value
    elif h["a"]:
        name = data.draw(st.sampled_from(sorted(h["a"])))
        if slot == "array_spec":
            h2["a"][name] = value
        else:
            h2["a"][name][1] = data.draw(st.lists(st.integers(0, 2 ** 64 - 1), max_size=70))
    decode_or_decode_error([msgpack.packb(h2), *frames[1:]])
