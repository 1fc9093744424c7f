"""msgpack header + numpy arrays as separate zero-copy frames. Never pickle.

Frame 0 is a msgpack map {"v": major version, "t": type, "f": scalar fields, "a": {name: [dtype, shape]}};
frames 1..n are the raw bytes of the arrays named in "a", in order. Every decode failure raises
DecodeError with a short machine-readable reason, so receivers can count it and keep serving.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterator, NamedTuple

import msgpack
import numpy as np
import zmq

from turnstream.protocol import PROTOCOL_VERSION
from turnstream.protocol.messages import MESSAGE_TYPES, Message

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
MAX_ARRAY_DIMS = 4


class DecodeError(ValueError):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason  # bounded vocabulary, usable as a metric label


def encode(msg: Message, *, alt_dtypes: bool = False) -> list[bytes | memoryview]:
    """Frames of `msg`. alt_dtypes: arrays that have a second dtype (Message.ALT_DTYPES) travel in it, viewed
    without a copy; only for a receiver that announced it takes them."""
    spec = _class_spec(type(msg))
    values = msg.__dict__
    arrays: dict[str, list] = {}
    frames: list[bytes | memoryview] = []
    for name, dtype, spelling_of, alt in spec.arrays:
        arr = np.ascontiguousarray(values[name])
        spelling = spelling_of.get(arr.dtype)
        if spelling is None:  # not a dtype the field may travel in: cast to its own
            arr = arr.astype(dtype)
            spelling = spelling_of[dtype]
        if alt_dtypes and alt is not None and arr.dtype == dtype:
            arr = arr.view(alt)
            spelling = spelling_of[alt]
        arrays[name] = [spelling, list(arr.shape)]
        frames.append(memoryview(arr).cast("B"))
    scalars = {name: values[name] for name in spec.scalar_names}
    header = msgpack.packb({"v": PROTOCOL_VERSION, "t": msg.TYPE, "f": scalars, "a": arrays})
    return [header, *frames]


# A scalar field's type, as msgpack yields it: exact types, so `type(v) is` suffices (and bool is not taken
# for int). decode's fast path compares these; a field whose type is not here is always checked.
_EXACT_TYPES = {"str": str, "int": int, "float": float, "bool": bool}


def _is(t: type):
    return lambda v: type(v) is t


_SCALAR_CHECKS = {
    **{name: _is(t) for name, t in _EXACT_TYPES.items()},
    "float": lambda v: type(v) is float or type(v) is int,  # an integer-valued float may travel as an int
    "list[str]": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "list[float]": lambda v: isinstance(v, list) and all(_SCALAR_CHECKS["float"](x) for x in v),
    "list[list[int]]": lambda v: isinstance(v, list) and all(
        isinstance(x, list) and all(_SCALAR_CHECKS["int"](y) for y in x) for x in v),
}


class _ClassSpec(NamedTuple):
    """What encode and decode need to know about a message class, derived once from its dataclass fields
    (dataclasses.fields() builds its tuple anew on every call, np.dtype() parses its argument, and
    `dtype.str` builds a new string on every read)."""
    scalars: tuple[tuple, ...]  # (name, type check, required, is_float) per scalar field
    scalar_names: tuple[str, ...]
    scalar_types: tuple[type, ...] | None  # None if a scalar's type is not in _EXACT_TYPES (a list)
    # per array field, in order: (name, its dtype, {dtype it may travel in: spelling}, its second dtype or None)
    arrays: tuple[tuple[str, np.dtype, dict[np.dtype, str], np.dtype | None], ...]
    accepted: dict[str, dict[str, np.dtype]]  # the same dtypes by spelling, for decode
    required_arrays: tuple[str, ...]


_SPECS: dict[type, _ClassSpec] = {}


def _class_spec(cls) -> _ClassSpec:
    spec = _SPECS.get(cls)
    if spec is None:
        fields = dataclasses.fields(cls)
        scalar_fields = [f for f in fields if f.name not in cls.ARRAYS]
        arrays = []
        for f in fields:
            if f.name in cls.ARRAYS:
                alt = cls.ALT_DTYPES.get(f.name)
                dtypes = [np.dtype(cls.ARRAYS[f.name])] + ([np.dtype(alt)] if alt else [])
                arrays.append((f.name, dtypes[0], {d: d.str for d in dtypes}, dtypes[1] if alt else None))
        types = [_EXACT_TYPES.get(str(f.type)) for f in scalar_fields]
        spec = _SPECS[cls] = _ClassSpec(
            scalars=tuple((f.name, _SCALAR_CHECKS.get(str(f.type)), _required(cls, f.name), f.type == "float")
                          for f in scalar_fields),
            scalar_names=tuple(f.name for f in scalar_fields),
            scalar_types=None if None in types else tuple(types),
            arrays=tuple(arrays),
            accepted={name: {s: d for d, s in spelling_of.items()} for name, _, spelling_of, _ in arrays},
            required_arrays=tuple(n for n in cls.ARRAYS if _required(cls, n)))
    return spec


def _required(cls, name: str) -> bool:
    f = cls.__dataclass_fields__[name]
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def parse_header(buf) -> dict:
    """Frame 0 as a map (not yet checked beyond that); DecodeError if it is not one."""
    try:
        header = msgpack.unpackb(buf, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise DecodeError("bad_header", type(exc).__name__) from None
    if not isinstance(header, dict):
        raise DecodeError("bad_header", "header is not a map")
    return header


def decode(frames: list, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Message:
    """Decode a multipart message; raise DecodeError (never anything else) on bad input."""
    buffers = _within_limit(_buffers(frames), max_bytes)
    return _decode_parsed(parse_header(buffers[0]), buffers)


def decode_bundle(frames: list, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
                  ) -> Iterator[tuple[Message | DecodeError, list]]:
    """The messages of a bundle (several messages' frames back to back in one multipart message, SCHEMA.md),
    in order, each with its own frames; a single message is a bundle of one. A message that does not decode
    comes as its DecodeError, and the next ones still come: its header said where it ends. Raises DecodeError
    where that cannot be known (see split_bundle)."""
    buffers = _buffers(frames)
    for header, start, end in split_bundle(buffers):
        try:  # the size limit is each message's, as if it had come alone
            item: Message | DecodeError = _decode_parsed(header, _within_limit(buffers[start:end], max_bytes))
        except DecodeError as exc:
            item = exc
        yield item, frames[start:end]


def split_bundle(buffers: list) -> Iterator[tuple[dict, int, int]]:
    """(parsed frame 0, first frame, end) of each message of a bundle: a message's frame 0 declares how many
    array frames follow it. Raises DecodeError where the next message cannot be delimited: a frame 0 that
    does not parse, or more arrays declared than frames are left."""
    start = 0
    while start < len(buffers):
        header = parse_header(buffers[start])
        arrays = header.get("a")
        end = start + 1 + (len(arrays) if isinstance(arrays, dict) else 0)
        if end > len(buffers):
            raise DecodeError("frame_count", f"{end - start - 1} arrays declared, {len(buffers) - start - 1} frames")
        yield header, start, end
        start = end


def _buffers(frames: list) -> list:
    """The frames as buffers whose len() is their size in bytes. A zmq.Frame or bytes is kept as it is: an
    array decoded from it then holds it as its base, where a memoryview in between would cost three more
    objects per array, about 300 bytes, kept as long as the array (a buffer keeps five arrays per chunk)."""
    if not frames:
        raise DecodeError("empty")
    return [f if type(f) in _SIZED_BY_LEN else memoryview(f).cast("B") for f in frames]


_SIZED_BY_LEN = (zmq.Frame, bytes)


def _within_limit(buffers: list, max_bytes: int) -> list:
    total = sum(map(len, buffers))
    if total > max_bytes:
        raise DecodeError("oversized", f"{total} bytes > limit {max_bytes}")
    return buffers


def _decode_parsed(header: dict, buffers: list) -> Message:
    version, type_name = header.get("v"), header.get("t")
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise DecodeError("unknown_version", f"got {version!r}, speak {PROTOCOL_VERSION}")
    cls = MESSAGE_TYPES.get(type_name) if isinstance(type_name, str) else None
    if cls is None:
        raise DecodeError("unknown_type", repr(header.get("t"))[:64])
    scalars, arrays = header.get("f"), header.get("a")
    if not isinstance(scalars, dict) or not isinstance(arrays, dict):
        raise DecodeError("bad_header", "f and a must be maps")
    if len(arrays) != len(buffers) - 1:
        raise DecodeError("frame_count", f"{len(arrays)} arrays declared, {len(buffers) - 1} frames")

    class_spec = _class_spec(cls)
    kwargs: dict[str, Any] = {}
    for i, (name, spec) in enumerate(arrays.items(), start=1):
        accepted, buf = class_spec.accepted.get(name), buffers[i]
        # What encode writes, a 1-D array in an accepted dtype spelled as `dtype.str`, costs a dict lookup instead
        # of parsing a dtype (that was a third of decode's time); anything else takes the full check.
        if accepted is not None and type(spec) is list and len(spec) == 2 and type(spec[1]) is list \
                and len(spec[1]) == 1 and type(spec[0]) is str and type(spec[1][0]) is int:
            dtype = accepted.get(spec[0])
            if dtype is not None and spec[1][0] * dtype.itemsize == len(buf):
                kwargs[name] = np.frombuffer(buf, dtype)
                continue
        kwargs[name] = _decode_array(cls, accepted, name, spec, buf)
    if tuple(scalars) == class_spec.scalar_names and tuple(map(type, scalars.values())) == class_spec.scalar_types:
        kwargs.update(scalars)  # every field, in order, of exactly the type encode writes: nothing to convert
    else:
        kwargs.update(_checked_scalars(cls, class_spec, scalars))
    for name in class_spec.required_arrays:
        if name not in kwargs:
            raise DecodeError("missing_field", f"{cls.TYPE}.{name}")
    return cls(**kwargs)


def _checked_scalars(cls, class_spec: _ClassSpec, scalars: dict) -> dict[str, Any]:
    out = {}
    for name, check, required, is_float in class_spec.scalars:
        if name not in scalars:
            if required:
                raise DecodeError("missing_field", f"{cls.TYPE}.{name}")
            continue
        value = scalars[name]
        if check is not None and not check(value):
            raise DecodeError("bad_field", f"{cls.TYPE}.{name} is not {cls.__dataclass_fields__[name].type}")
        out[name] = float(value) if is_float else value
    return out


def _read_spec(spec, where: str) -> tuple[np.dtype, list[int], int]:
    """dtype, shape and byte size of one array spec [dtype string, shape] of a header."""
    if not (isinstance(spec, list) and len(spec) == 2 and isinstance(spec[0], str)
            and isinstance(spec[1], list) and len(spec[1]) <= MAX_ARRAY_DIMS
            and all(type(d) is int and 0 <= d < 2**40 for d in spec[1])):
        raise DecodeError("bad_array_spec", where)
    try:
        dtype = np.dtype(spec[0])
    except (TypeError, ValueError):
        raise DecodeError("bad_dtype", where) from None
    nbytes = dtype.itemsize
    for d in spec[1]:  # Python ints: no silent int64 overflow on hostile shapes
        nbytes *= d
    return dtype, spec[1], nbytes


def _decode_array(cls, accepted: dict[str, np.dtype] | None, name: str, spec, buf) -> np.ndarray:
    """The full check of one array (decode reads the usual case faster). `accepted`: the dtypes the field may
    travel in, by `dtype.str` (None: the class has no such array)."""
    if accepted is None:
        raise DecodeError("unknown_array", f"{cls.TYPE}.{name}")
    dtype, shape, nbytes = _read_spec(spec, f"{cls.TYPE}.{name}")
    if dtype not in accepted.values():
        raise DecodeError("bad_dtype", f"{cls.TYPE}.{name} is {dtype}, want {cls.ARRAYS[name]}")
    if nbytes != len(buf):
        raise DecodeError("truncated", f"{cls.TYPE}.{name}: {len(buf)} bytes for shape {shape}")
    return np.frombuffer(buf, dtype=dtype).reshape(shape)
