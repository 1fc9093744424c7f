"""msgpack header + numpy arrays as separate zero-copy frames. Never pickle.

Frame 0 is a msgpack map {"v": major version, "t": type, "f": scalar fields, "a": {name: [dtype, shape]}};
frames 1..n are the raw bytes of the arrays named in "a", in order. Every decode failure raises
DecodeError with a short machine-readable reason, so receivers can count it and keep serving.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple

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


def encode(msg: Message) -> list[bytes | memoryview]:
    """Frames of `msg`; an array in another dtype than its field's is cast to it."""
    spec = _class_spec(type(msg))
    values = msg.__dict__
    arrays: dict[str, list] = {}
    frames: list[bytes | memoryview] = []
    for name, (dtype, spelling) in spec.arrays.items():
        arr = np.ascontiguousarray(values[name])
        if arr.dtype != dtype:
            arr = arr.astype(dtype)
        arrays[name] = [spelling, list(arr.shape)]
        frames.append(memoryview(arr).cast("B"))
    scalars = {name: values[name] for name, *_ in spec.scalars}
    header = msgpack.packb({"v": PROTOCOL_VERSION, "t": msg.TYPE, "f": scalars, "a": arrays})
    return [header, *frames]


def decode(frames: list, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Message:
    """Decode a multipart message; raise DecodeError (never anything else) on bad input."""
    if not frames:
        raise DecodeError("empty")
    buffers = [f if type(f) in _SIZED_BY_LEN else memoryview(f).cast("B") for f in frames]
    total = sum(map(len, buffers))
    if total > max_bytes:
        raise DecodeError("oversized", f"{total} bytes > limit {max_bytes}")
    header = _parse_header(buffers[0])
    version, type_name = header.get("v"), header.get("t")
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise DecodeError("unknown_version", f"got {version!r}, speak {PROTOCOL_VERSION}")
    cls = MESSAGE_TYPES.get(type_name) if isinstance(type_name, str) else None
    if cls is None:
        raise DecodeError("unknown_type", repr(type_name)[:64])
    scalars, arrays = header.get("f"), header.get("a")
    if not isinstance(scalars, dict) or not isinstance(arrays, dict):
        raise DecodeError("bad_header", "f and a must be maps")
    if len(arrays) != len(buffers) - 1:
        raise DecodeError("frame_count", f"{len(arrays)} arrays declared, {len(buffers) - 1} frames")

    spec = _class_spec(cls)
    kwargs: dict[str, Any] = {}
    for (name, array_spec), buf in zip(arrays.items(), buffers[1:]):
        kwargs[name] = _read_array(cls, spec, name, array_spec, buf)
    for name in spec.required_arrays:
        if name not in kwargs:
            raise DecodeError("missing_field", f"{cls.TYPE}.{name}")
    for name, check, required, is_float in spec.scalars:
        if name not in scalars:  # a field this peer does not send takes its default
            if required:
                raise DecodeError("missing_field", f"{cls.TYPE}.{name}")
            continue
        value = scalars[name]
        if not check(value):
            raise DecodeError("bad_field", f"{cls.TYPE}.{name} is not {cls.__dataclass_fields__[name].type}")
        kwargs[name] = float(value) if is_float else value
    return cls(**kwargs)


# A zmq.Frame or bytes is kept as the base of the arrays decoded from it: a memoryview in between would add
# objects per array, kept as long as the buffer keeps the chunk.
_SIZED_BY_LEN = (zmq.Frame, bytes)


def _parse_header(buf) -> dict:
    try:
        header = msgpack.unpackb(buf, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise DecodeError("bad_header", type(exc).__name__) from None
    if not isinstance(header, dict):
        raise DecodeError("bad_header", "header is not a map")
    return header


def _read_array(cls, spec: "_ClassSpec", name: str, array_spec, buf) -> np.ndarray:
    """One array frame, checked against its [dtype string, shape] in the header and its field's dtype."""
    where = f"{cls.TYPE}.{name}"
    field = spec.arrays.get(name)
    if field is None:
        raise DecodeError("unknown_array", where)
    dtype, spelling = field
    if not (type(array_spec) is list and len(array_spec) == 2 and type(array_spec[0]) is str
            and type(array_spec[1]) is list and len(array_spec[1]) <= MAX_ARRAY_DIMS
            and all(type(d) is int and 0 <= d < 2**40 for d in array_spec[1])):
        raise DecodeError("bad_array_spec", where)
    if array_spec[0] != spelling:
        raise DecodeError("bad_dtype", f"{where} is {array_spec[0][:16]!r}, want {spelling!r}")
    shape = array_spec[1]
    if math.prod(shape) * dtype.itemsize != len(buf):
        raise DecodeError("truncated", f"{where}: {len(buf)} bytes for shape {shape}")
    arr = np.frombuffer(buf, dtype)
    return arr if len(shape) == 1 else arr.reshape(shape)


def _is(t: type) -> Callable[[Any], bool]:
    return lambda v: type(v) is t  # msgpack yields exact types; a bool is not taken for an int


def _is_float(v) -> bool:
    return type(v) is float or type(v) is int  # an integer-valued float may travel as an int


def _list_of(*types: type) -> Callable[[Any], bool]:
    allowed = frozenset(types)
    return lambda v: type(v) is list and allowed.issuperset(map(type, v))


_SCALAR_CHECKS: dict[str, Callable[[Any], bool]] = {
    "str": _is(str), "int": _is(int), "bool": _is(bool), "float": _is_float,
    "list[str]": _list_of(str), "list[int]": _list_of(int), "list[bool]": _list_of(bool),
    "list[float]": _list_of(float, int),
    "list[list[int]]": lambda v: type(v) is list and all(type(x) is list and all(type(y) is int for y in x)
                                                         for x in v),
}


class _ClassSpec(NamedTuple):
    """What encode and decode need to know about a message class, derived once from its dataclass fields."""
    scalars: tuple[tuple[str, Callable[[Any], bool], bool, bool], ...]  # (name, type check, required, is_float)
    arrays: dict[str, tuple[np.dtype, str]]  # name -> (its dtype, that dtype's spelling on the wire)
    required_arrays: tuple[str, ...]


_SPECS: dict[type, _ClassSpec] = {}


def _class_spec(cls) -> _ClassSpec:
    spec = _SPECS.get(cls)
    if spec is None:
        fields = dataclasses.fields(cls)
        arrays = {f.name: np.dtype(cls.ARRAYS[f.name]) for f in fields if f.name in cls.ARRAYS}
        spec = _SPECS[cls] = _ClassSpec(
            scalars=tuple((f.name, _SCALAR_CHECKS[str(f.type)], _required(f), f.type == "float")
                          for f in fields if f.name not in cls.ARRAYS),
            arrays={name: (dtype, dtype.str) for name, dtype in arrays.items()},
            required_arrays=tuple(f.name for f in fields if f.name in cls.ARRAYS and _required(f)))
    return spec


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
