"""buffer.slab_receive: large frames land in recycled slabs, decode as before, and bad frames are refused.

Real ZeroMQ DEALER -> ROUTER sockets on 127.0.0.1; the receiver is the buffer's own.
"""
from __future__ import annotations

import gc
import json
import platform
import subprocess
import sys

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from buffer.slab_receive import MIN_POOLED_FRAME, SlabPool, SlabReceiver, keep_receive_buffers_warm
from protocol import PROTOCOL_VERSION
from protocol.codec import DecodeError, decode, encode
from tests.helpers import chunk, in_pool, poll_until

SLAB = 1 << 20  # small slabs keep the test's memory small; the buffer's are 16 MiB


@pytest.fixture
def pair():
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer.connect(f"tcp://127.0.0.1:{port}")
    yield router, dealer
    ctx.destroy(linger=0)


def big_chunk(i: int, n_obs: int = 75_000):  # a 300 KB obs frame: three fit in a 1 MiB slab
    return chunk(f"e{i}", 0, seq=i, obs=(np.arange(n_obs) + i) % 30000, gen=(7, 8))


def receive(receiver: SlabReceiver, router):
    return poll_until(lambda: receiver.receive(router), "a message", 10.0, interval_s=0.01)


def test_large_frames_land_in_the_pool_and_decode_equal(pair):
    router, dealer = pair
    pool = SlabPool(4 * SLAB, slab_bytes=SLAB)
    receiver = SlabReceiver(pool, max_message_bytes=1 << 24)
    sent = big_chunk(0)
    dealer.send_multipart(encode(sent))
    msg = receive(receiver, router)
    assert msg.error is None
    got = decode(msg.frames, 1 << 24, msg.header)
    np.testing.assert_array_equal(got.obs_tokens, sent.obs_tokens)
    np.testing.assert_array_equal(got.gen_tokens, sent.gen_tokens)
    assert got.episode_id == "e0"
    assert in_pool(pool, got.obs_tokens)  # the large frame: a view into a slab
    assert not in_pool(pool, got.gen_tokens)  # small frames: received as before
    assert receiver.misses == 0


def test_a_slab_is_reused_only_after_every_chunk_in_it_is_gone(pair):
    router, dealer = pair
    pool = SlabPool(2 * SLAB, slab_bytes=SLAB)
    receiver = SlabReceiver(pool, max_message_bytes=1 << 24)
    held = []
    for i in range(6):
        dealer.send_multipart(encode(big_chunk(i)))
        msg = receive(receiver, router)
        held.append(decode(msg.frames, 1 << 24, msg.header))
    assert all(in_pool(pool, c.obs_tokens) for c in held) and receiver.misses == 0
    dealer.send_multipart(encode(big_chunk(6)))  # both slabs hold live chunks: plain receive, counted
    msg = receive(receiver, router)
    seventh = decode(msg.frames, 1 << 24, msg.header)
    assert receiver.misses == 1 and not in_pool(pool, seventh.obs_tokens)
    np.testing.assert_array_equal(seventh.obs_tokens, big_chunk(6).obs_tokens)
    del held[:2]  # two of the first slab's three chunks: still not free
    gc.collect()
    dealer.send_multipart(encode(big_chunk(7)))
    receive(receiver, router)
    assert receiver.misses == 2
    del held[0]  # now the first slab holds nothing
    dealer.send_multipart(encode(big_chunk(8)))
    msg = receive(receiver, router)
    eighth = decode(msg.frames, 1 << 24, msg.header)
    assert receiver.misses == 2 and in_pool(pool, eighth.obs_tokens)
    for c in held:  # the chunks still held were not overwritten by the reuse
        np.testing.assert_array_equal(c.obs_tokens, big_chunk(int(c.episode_id[1:])).obs_tokens)


def test_a_frame_longer_than_its_header_says_is_refused_and_the_next_message_still_arrives(pair):
    router, dealer = pair
    receiver = SlabReceiver(SlabPool(2 * SLAB, slab_bytes=SLAB), max_message_bytes=1 << 24)
    frames = encode(big_chunk(0))
    frames[1] = bytes(frames[1]) + b"\0" * 4096  # obs frame longer than declared
    dealer.send_multipart(frames)
    dealer.send_multipart(encode(big_chunk(1)))
    bad = receive(receiver, router)
    assert isinstance(bad.error, DecodeError) and bad.error.reason == "truncated"
    good = receive(receiver, router)
    assert good.error is None and decode(good.frames, 1 << 24, good.header).episode_id == "e1"


def test_a_header_claiming_more_than_the_limit_reserves_nothing(pair):
    router, dealer = pair
    pool = SlabPool(2 * SLAB, slab_bytes=SLAB)
    receiver = SlabReceiver(pool, max_message_bytes=1 << 20)
    header = msgpack.packb({"v": PROTOCOL_VERSION, "t": "turn_chunk", "f": {},
                            "a": {"obs_tokens": ["<i4", [1 << 30]]}})
    dealer.send_multipart([header, b"\0" * MIN_POOLED_FRAME])
    msg = receive(receiver, router)
    assert pool.offset == 0 and receiver.misses == 0
    with pytest.raises(DecodeError):
        decode(msg.frames, 1 << 20, msg.header)


FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@given(data=st.data())
@FUZZ
def test_the_pooled_receive_decodes_exactly_as_a_plain_receive(pair, data):
    """Mutated messages (headers that lie about sizes, cut or padded frames, extra frames): the pooled
    path yields the same message or refuses it, as decode() of the plain frames does."""
    router, dealer = pair
    receiver = SlabReceiver(SlabPool(2 * SLAB, slab_bytes=SLAB), max_message_bytes=1 << 22)
    frames = [bytes(f) for f in encode(big_chunk(data.draw(st.integers(0, 100), "i"),
                                                 n_obs=data.draw(st.integers(1, 80_000), "n_obs")))]
    i = data.draw(st.integers(0, len(frames) - 1), "frame")
    cut = data.draw(st.integers(-8, 8), "delta")
    frames[i] = frames[i][:max(0, len(frames[i]) + cut)] if cut < 0 else frames[i] + b"\1" * cut
    if data.draw(st.booleans(), "extra"):
        frames.append(b"\0" * data.draw(st.sampled_from([0, 8, MIN_POOLED_FRAME]), "extra_size"))
    try:
        expected = decode(frames, 1 << 22)
    except DecodeError:
        expected = None
    dealer.send_multipart(frames)
    msg = receive(receiver, router)
    try:
        if msg.error is not None:
            raise msg.error
        got = decode(msg.frames, 1 << 22, msg.header)
    except DecodeError:
        got = None
    if expected is None:
        assert got is None
    else:
        assert got is not None and got.episode_id == expected.episode_id
        np.testing.assert_array_equal(got.obs_tokens, expected.obs_tokens)
        np.testing.assert_array_equal(got.gen_logprobs, expected.gen_logprobs)


MALLINFO_PROBE = r"""
import ctypes, ctypes.util, json, sys
from buffer.slab_receive import keep_receive_buffers_warm

class MallInfo2(ctypes.Structure):  # glibc's struct mallinfo2: ten size_t fields; hblkhd is mmap'd bytes
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]

def mapped_by_one_mib_malloc():
    before = libc.mallinfo2().hblkhd
    p = libc.malloc(1 << 20)
    mapped = libc.mallinfo2().hblkhd - before
    libc.free(p)
    return mapped

plain = mapped_by_one_mib_malloc()
took = keep_receive_buffers_warm()
print(json.dumps({"plain": plain, "took": took, "warm": mapped_by_one_mib_malloc()}))
"""


def test_receive_buffers_come_from_malloc_heaps_after_the_buffer_tunes_glibc():
    """A fresh process (the setting is process-wide): by default a 1 MiB malloc is a fresh mmap, which the
    next frame's buffer would fault in again; after keep_receive_buffers_warm it comes from the heap."""
    if platform.libc_ver()[0] != "glibc":
        assert keep_receive_buffers_warm() is False  # elsewhere a no-op that says so
        return
    out = subprocess.run([sys.executable, "-c", MALLINFO_PROBE], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    assert result["plain"] >= 1 << 20 and result["took"] is True and result["warm"] == 0, result
