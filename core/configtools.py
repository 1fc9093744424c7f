"""Load nested dataclasses from TOML with strict validation and one-line error messages."""
from __future__ import annotations

import dataclasses
import json
import tomllib
import typing
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A configuration problem; str() is one line naming the field and what to fix."""


def check(cond: bool, path: str, message: str) -> None:
    if not cond:
        raise ConfigError(f"{path}: {message}")


def from_dict(cls, data: dict, path: str = ""):
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'config'}: expected a table, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in names:
            raise ConfigError(f"{_join(path, key)}: unknown field (known: {', '.join(sorted(names))})")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            kwargs[f.name] = _coerce(hints[f.name], data[f.name], _join(path, f.name))
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        validate(path)
    return obj


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _coerce(tp, value: Any, path: str):
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, path)
    if tp is bool:
        check(isinstance(value, bool), path, f"expected true or false, got {value!r}")
        return value
    if tp is int:
        check(isinstance(value, int) and not isinstance(value, bool), path, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        check(isinstance(value, (int, float)) and not isinstance(value, bool), path,
              f"expected a number, got {value!r}")
        return float(value)
    if tp is str:
        check(isinstance(value, str), path, f"expected a string, got {value!r}")
        return value
    if origin is list:
        check(isinstance(value, list), path, f"expected a list, got {value!r}")
        (item,) = typing.get_args(tp)
        return [_coerce(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if tp is dict or origin is dict:
        check(isinstance(value, dict), path, f"expected a table, got {value!r}")
        return dict(value)
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        check(value in allowed, path, f"must be one of {', '.join(map(_toml_value, allowed))}, got {value!r}")
        return value
    raise ConfigError(f"{path}: unsupported type {tp}")


def load_toml(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        return tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML ({exc})") from None


def to_dict(obj) -> dict:
    return dataclasses.asdict(obj)


def dump_toml(data: dict) -> str:
    """Write the subset of TOML that configs use: nested tables of scalars and lists."""
    lines: list[str] = []

    def emit(table: dict, prefix: list[str]) -> None:
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
        tables = {k: v for k, v in table.items() if isinstance(v, dict)}
        if prefix and (scalars or not tables):
            lines.append("[" + ".".join(_toml_key(p) for p in prefix) + "]")
        for k, v in scalars.items():
            lines.append(f"{_toml_key(k)} = {_toml_value(v)}")
        if scalars:
            lines.append("")
        for k, v in tables.items():
            emit(v, [*prefix, k])

    emit(data, [])
    return "\n".join(lines) + "\n"


def _toml_key(key: str) -> str:
    return key if key and all(c.isascii() and (c.isalnum() or c in "_-") for c in key) else json.dumps(key)


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise ConfigError(f"cannot write {v!r} to TOML")
