"""The record's files: `<run_dir>/record/`, one directory per learner start (an incarnation), one file per step.

    record/
      learner-0000/               the first learner start of the run
        start.msgpack             how it started: the version it started from, the checkpoint it resumed from,
                                  ranks, seed, the config it ran with
        step-000001.msgpack       the step that produced policy version 1: its batch, RNG state, request id
        step-000002.msgpack
        lost-000003.msgpack       a step taken whose file could not be written (say a full disk)
      learner-0001/               the learner restarted (resumed from its latest checkpoint, say version 2):
        start.msgpack             start_version 2
        step-000003.msgpack       the retrained steps; learner-0000's steps past version 2, if any, are superseded

Every file is one msgpack map (`FORMAT_VERSION` under "format", its "kind": "start", "step" or "lost"). A step
file's "batch" is the protocol's own encoding of the Batch (protocol/codec.py: a msgpack header frame, then one
frame per array), each frame zlib-compressed when "zlib" is true. A file is written under a temporary name,
fsynced and renamed into place, and the directory fsynced: a file is complete or absent, never torn, so no
checksum or tail repair is needed, and any step is read by its name alone.

Why a file per step rather than one append-only log: atomic publication (no torn tail), random access by name for
`inspect --step N` and `replay --from-checkpoint`, and the retrained steps of a restarted learner sit beside the
ones they supersede under their own incarnation. The cost is two fsyncs per step (file and directory), small next
to a step.

A step's file is written after the step and made durable before anything outside the learner can see the version
it produced (its checkpoint, its push and announcement, its line in learner.jsonl). So a learner killed between
a step and its file has not checkpointed that version either: its restart resumes from an earlier checkpoint and
retrains the step, recorded in the new incarnation. A step is *lost* only when its file could not be written (the
learner keeps training, writes a lost marker if it can, and logs the error); the reader also names as lost any
version in an incarnation's range without a file (see reader.py). A batch the learner skipped (every episode over
the token budget: NothingToTrain) trained nothing, changed no state and is not recorded.
"""
from __future__ import annotations

import os
import zlib
from pathlib import Path

import msgpack

from turnstream.core.fsutil import fsync_dir

FORMAT_VERSION = 1
RECORD_DIR = "record"
START_FILE = "start.msgpack"
ZLIB_LEVEL = 1  # token arrays are small integers: level 1 already takes most of the gain, at the least CPU


class RecordError(ValueError):
    """A record that is missing or unreadable (a one-line message naming the file)."""


def record_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / RECORD_DIR


def incarnation_dir(run_dir: str | Path, index: int) -> Path:
    return record_dir(run_dir) / f"learner-{index:04d}"


def step_file(version: int) -> str:
    return f"step-{version:06d}.msgpack"


def lost_file(version: int) -> str:
    return f"lost-{version:06d}.msgpack"


def version_of_file(name: str) -> int:
    """step-000012.msgpack or lost-000012.msgpack: 12."""
    return int(name.split("-", 1)[1].split(".", 1)[0])


def incarnation_index(path: Path) -> int:
    return int(path.name.split("-", 1)[1])


def pack_frames(frames: list, compress: bool) -> list[bytes]:
    return [zlib.compress(f, ZLIB_LEVEL) if compress else bytes(f) for f in frames]


def unpack_frames(frames: list[bytes], compressed: bool) -> list[bytes]:
    return [zlib.decompress(f) for f in frames] if compressed else frames


def write_file(path: Path, entry: dict) -> int:
    """`entry` as `path`, atomically and durably (temporary name, fsync, rename, fsync of the directory); returns
    the bytes written."""
    data = msgpack.packb({"format": FORMAT_VERSION, **entry}, use_bin_type=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return len(data)


def read_file(path: Path) -> dict:
    try:
        entry = msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False)
    except (OSError, ValueError, msgpack.UnpackException) as exc:
        raise RecordError(f"record file {path} is unreadable: {exc}") from None
    if not isinstance(entry, dict) or entry.get("format") != FORMAT_VERSION:
        raise RecordError(f"record file {path} is not format {FORMAT_VERSION}")
    return entry
