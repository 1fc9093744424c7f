"""What pydantic does not do for the config: TOML in and out, `--set` overrides, one-line errors.

A rule that spans fields raises `FieldProblem` from a section's model validator (core/config_fields.py),
so that its message names the field to fix rather than the section.
"""
from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError


class ConfigError(ValueError):
    """A configuration problem; str() is one line naming the field and what to fix."""


class FieldProblem(ValueError):
    """Raised inside a section's validator: `field` of that section is wrong."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def require(cond: bool, field: str, message: str) -> None:
    if not cond:
        raise FieldProblem(field, message)


def from_dict(cls: type[BaseModel], data: Any, path: str = ""):
    """`cls` validated from plain data (a TOML table), or a one-line ConfigError under `path`."""
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc.errors()[0], data, path)) from None


# pydantic's wording where it does not say what to write instead
_MESSAGES = {
    "model_type": "expected a table",
    "model_attributes_type": "expected a table",
    "union_tag_not_found": "needs a {discriminator} key",
    "missing": "required",
}


def _one_line(error: dict, data: Any, path: str) -> str:
    where = _dotted(error["loc"], data, path, missing=error["type"] == "missing")
    cause = error.get("ctx", {}).get("error")
    if isinstance(cause, FieldProblem):
        return f"{_join(where, cause.field)}: {cause}"
    if isinstance(cause, ValueError):
        return f"{where or 'config'}: {cause}"
    message = _MESSAGES.get(error["type"], error["msg"]).format(**error.get("ctx", {}))
    got = "" if error["type"] == "missing" else f" (got {error['input']!r})"
    return f"{where or 'config'}: {message}{got}"


def _dotted(loc: tuple, data: Any, path: str, missing: bool) -> str:
    """`vllm.urls[0]` for ('vllm', 'urls', 0). A tagged union adds its tag to pydantic's location
    (('vllm', 'weight_sync', 'nccl', 'master_port')), and a union of a number and "auto" the name of the member
    after the value (('learner', 'lr', 'constrained-float')); neither is a key of the input, so both are skipped.
    Only a missing field is named that the input lacks."""
    where = path
    for i, part in enumerate(loc):
        if isinstance(part, int):
            where += f"[{part}]"
            data = data[part] if isinstance(data, list) and part < len(data) else None
        elif data is None or isinstance(data, dict) and (part in data or (missing and i == len(loc) - 1)):
            where = _join(where, part)
            data = data.get(part) if isinstance(data, dict) else None
    return where


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def load_toml(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        return tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML ({exc})") from None


def apply_override(data: dict, item: str) -> None:
    """`section.key=value`, value parsed as TOML (so strings need quotes unless they are bare words)."""
    if "=" not in item:
        raise ConfigError(f"--set {item}: expected section.key=value")
    key, raw = item.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word such as spo or a path
    parts = key.strip().split(".")
    node = data
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {item}: {p} is not a table")
    node[parts[-1]] = value


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
