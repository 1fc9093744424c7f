"""buffer.warm_heap: sizes it refuses, and what it does to a fresh process's malloc (glibc's own counters).

The effect on a real buffer process (page faults per ingested megabyte) is in
tests/integration/test_ingest_reserve.py.
"""
from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from turnstream.buffer.warm_heap import MAX_RESERVE_BYTES, reserve_warm_heap


@pytest.mark.parametrize("nbytes", [0, -1, MAX_RESERVE_BYTES + 1])
def test_a_reserve_out_of_range_is_refused(nbytes):
    with pytest.raises(ValueError, match="reserve must be in"):
        reserve_warm_heap(nbytes)


MALLINFO_PROBE = r"""
import ctypes, ctypes.util, json, sys
from turnstream.buffer.warm_heap import reserve_warm_heap

class MallInfo2(ctypes.Structure):  # glibc's struct mallinfo2: ten size_t fields
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]

def mapped_by_one_mib_malloc():  # hblkhd: bytes in mmap'd blocks
    before = libc.mallinfo2().hblkhd
    p = libc.malloc(1 << 20)
    mapped = libc.mallinfo2().hblkhd - before
    libc.free(p)
    return mapped

plain = mapped_by_one_mib_malloc()
took = reserve_warm_heap(int(sys.argv[1]))
print(json.dumps({"plain": plain, "took": took, "after": mapped_by_one_mib_malloc(),
                  "free_heap": libc.mallinfo2().fordblks}))
"""


def test_the_reserve_leaves_its_bytes_free_in_the_heap_and_large_frames_come_from_there():
    """A fresh process (the settings are process-wide): by default a 1 MiB malloc is a fresh mmap; after the
    reserve it comes from the heap, which keeps the reserve's bytes free and mapped."""
    if platform.libc_ver()[0] != "glibc":
        assert reserve_warm_heap(1 << 20) is False  # elsewhere a no-op that says so
        return
    reserve = 48 * 1024 * 1024
    out = subprocess.run([sys.executable, "-c", MALLINFO_PROBE, str(reserve)], capture_output=True, text=True,
                         check=True)
    result = json.loads(out.stdout)
    assert result["plain"] >= 1 << 20 and result["took"] is True and result["after"] == 0, result
    assert result["free_heap"] >= reserve, result
