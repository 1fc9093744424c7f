"""Golden bytes for schema v2: today's encoder must produce exactly the recorded frames, and the recorded
frames must keep decoding to the same messages (so an older peer's bytes stay readable).

To re-record after an *intended*, backwards-compatible change (a new optional field), run
`PYTHONPATH=. python tests/unit/test_protocol_golden.py --record` and review the diff of the fixture file.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import msgpack
import numpy as np
import pytest

from turnstream.protocol import PROTOCOL_VERSION
from turnstream.protocol.codec import DecodeError, decode, encode
from turnstream.protocol.messages import MESSAGE_TYPES, BatchRequest, CreditGrant, TurnChunkBatch
from tests.unit.test_codec import SAMPLES, assert_same_message

FIXTURE = Path(__file__).parent / "fixtures" / "protocol_v2_golden.json"


def _golden() -> dict[str, list[bytes]]:
    return {t: [bytes.fromhex(h) for h in frames] for t, frames in json.loads(FIXTURE.read_text()).items()}


def test_golden_file_covers_every_message_type():
    assert set(_golden()) == set(MESSAGE_TYPES)


@pytest.mark.parametrize("type_name", sorted(MESSAGE_TYPES))
def test_encoder_reproduces_the_golden_bytes(type_name):
    assert [bytes(f) for f in encode(SAMPLES[type_name]())] == _golden()[type_name]


@pytest.mark.parametrize("type_name", sorted(MESSAGE_TYPES))
def test_golden_bytes_decode_to_the_sample(type_name):
    assert_same_message(SAMPLES[type_name](), decode(_golden()[type_name]))


def test_golden_header_states_major_version_2():
    for frames in _golden().values():
        assert msgpack.unpackb(frames[0])["v"] == PROTOCOL_VERSION == 2


def test_a_message_without_its_optional_fields_still_decodes():
    """Optional fields (max_tokens, timeout_s, learner_version, server_id) take their defaults."""
    bare = [msgpack.packb({"v": 2, "t": "batch_request", "f": {"request_id": 3, "learner_version": 2,
                                                                 "max_episodes": 8}, "a": {}})]
    assert decode(bare) == BatchRequest(request_id=3, learner_version=2, max_episodes=8, max_tokens=0,
                                        timeout_s=0.0)
    bare = [msgpack.packb({"v": 2, "t": "credit_grant", "f": {"credits": 2}, "a": {}})]
    assert decode(bare) == CreditGrant(credits=2, learner_version=0, server_id="")


def test_newer_minor_field_is_ignored_and_newer_major_version_is_refused():
    frames = _golden()["credit_grant"]
    header = msgpack.unpackb(frames[0])
    header["f"]["added_in_a_later_release"] = [1, 2, 3]
    assert decode([msgpack.packb(header)]) == SAMPLES["credit_grant"]()
    for version in (1, 3):  # version 1 sent turn chunks as int32, alone or packed: refused, not misread
        header["v"] = version
        with pytest.raises(DecodeError) as info:
            decode([msgpack.packb(header)])
        assert info.value.reason == "unknown_version" and "speak 2" in str(info.value)


def test_turn_chunks_golden_frames_are_raw_little_endian_arrays():
    frames = _golden()["turn_chunks"]
    header = msgpack.unpackb(frames[0])
    assert list(header["a"]) == list(TurnChunkBatch.ARRAYS)
    sample = SAMPLES["turn_chunks"]()
    for i, name in enumerate(header["a"], start=1):
        np.testing.assert_array_equal(np.frombuffer(frames[i], dtype=header["a"][name][0]),
                                      getattr(sample, name).ravel())


if __name__ == "__main__" and "--record" in sys.argv:
    FIXTURE.write_text(json.dumps({t: [bytes(f).hex() for f in encode(make())] for t, make in sorted(SAMPLES.items())},
                                  indent=1) + "\n")
    print(f"wrote {FIXTURE}")
