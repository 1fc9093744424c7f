"""The configuration reference, generated from the pydantic models of the run configuration.

`python -m turnstream.reference.configuration --write` regenerates docs/configuration.md from `Config` (every table,
every key with its type, bounds, default and `description`, and the rules between keys that loading checks);
a unit test fails when the file and the models disagree, so the reference cannot drift from the code.
"""
from __future__ import annotations

import argparse
import ast
import inspect
import sys
import textwrap
import types
import typing
from dataclasses import dataclass
from pathlib import Path

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from turnstream.core.config import Config
from turnstream.core.config_fields import Section

DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"

_BOUNDS = ((annotated_types.Gt, "gt", ">"), (annotated_types.Ge, "ge", ">="),
           (annotated_types.Lt, "lt", "<"), (annotated_types.Le, "le", "<="))


@dataclass(frozen=True)
class Key:
    name: str
    type: str
    default: str
    description: str


@dataclass(frozen=True)
class Table:
    path: str  # dotted, as written in TOML: "learner.spo"
    intro: tuple[str, ...]  # paragraphs
    keys: tuple[Key, ...]
    rules: tuple[str, ...]  # "field: message" for every cross-field check of the model
    variant: str  # for one member of a tagged union, its tag: `backend = "nccl"`


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _constraints(metadata: list) -> list[str]:
    out = []
    for item in metadata:
        for kind, attr, symbol in _BOUNDS:
            if isinstance(item, kind):
                out.append(f"{symbol} {getattr(item, attr)}")
        if isinstance(item, annotated_types.MinLen) and item.min_length:
            out.append(f"at least {item.min_length} long")
        if isinstance(item, annotated_types.MaxLen):
            out.append(f"at most {item.max_length} long")
        pattern = getattr(item, "pattern", None)
        if isinstance(pattern, str):
            out.append(f"matching `{pattern}`")
        if isinstance(item, FieldInfo):
            out += _constraints(item.metadata)
    return out


def type_name(annotation: object, metadata: list | None = None) -> str:
    """How a TOML author reads a field's type: `int, >= 1`, `"fifo" | "group"`, `list of str`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0], [*args[1:], *(metadata or [])])
    if origin is typing.Literal:
        name = " \\| ".join(toml_value(a) for a in args)
    elif origin in (list, tuple):
        name = f"list of {type_name(args[0])}" if args else "list"
    elif origin is dict:
        name = "table" if not args or args[1] is typing.Any else f"table of {type_name(args[0])} = {type_name(args[1])}"
    elif origin in (typing.Union, types.UnionType):
        name = " \\| ".join(type_name(a) for a in args if a is not type(None))
        if type(None) in args:
            name += " (optional)"
    elif annotation is typing.Any:
        name = "any"
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        name = "table"
    else:
        name = getattr(annotation, "__name__", str(annotation))
    bounds = _constraints(metadata or [])
    return ", ".join([name, *bounds])


def default_of(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
    if value is None or value is PydanticUndefined:
        return "unset"
    if isinstance(value, BaseModel):
        return "table"
    return f"`{toml_value(value)}`"


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def _sentence(text: str | None) -> str:
    text = _one_line(text)
    first = text.split(" ", 1)[0]
    if first.islower() and first.isalpha():  # a name such as vLLM or a key such as max_tokens keeps its case
        text = text[:1].upper() + text[1:]
    return text + ("" if not text or text.endswith((".", ")", ":")) else ".")


def _formatted(node: ast.expr) -> str:
    """A rule's message as the source writes it; a value interpolated in parentheses is left out, as is a
    trailing ", got {value}" (both name the value the file had, which a reference cannot know)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if not isinstance(node, ast.JoinedStr):
        return ast.unparse(node)
    parts: list[str] = []
    closing = False  # the constant after a left-out "(value" starts with its ")"
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(str(value.value).removeprefix(")") if closing else str(value.value))
            closing = False
        elif parts and parts[-1].endswith(" ("):
            parts[-1], closing = parts[-1].removesuffix(" ("), True
        elif parts and parts[-1].endswith(", got "):
            parts[-1] = parts[-1].removesuffix(", got ")
        else:
            parts.append(ast.unparse(value.value).replace("self.", ""))
    return "".join(parts)


def rules_of(model: type[BaseModel], path: str) -> tuple[str, ...]:
    """The `require(condition, field, message)` checks in the model's own validators."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(model)))
    except (OSError, TypeError):
        return ()
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "require"
                and len(node.args) == 3 and isinstance(node.args[1], ast.Constant)):
            field = f"{path}.{node.args[1].value}" if path else str(node.args[1].value)
            out.append(f"`{field}`: {_one_line(_formatted(node.args[2]))}")
    return tuple(out)


def _models(annotation: object) -> list[type[Section]]:
    """The config tables a field holds: one model, an optional one, or the members of a tagged union."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _models(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(annotation) for m in _models(a)]
    return [annotation] if isinstance(annotation, type) and issubclass(annotation, Section) else []


def _variant_tag(model: type[Section]) -> tuple[str, str] | None:
    for name, field in model.model_fields.items():
        if typing.get_origin(field.annotation) is typing.Literal and len(typing.get_args(field.annotation)) == 1:
            return name, toml_value(typing.get_args(field.annotation)[0])
    return None


def tables(model: type[Section] = Config, path: str = "", intro: tuple[str, ...] = (),
           tagged: bool = False) -> list[Table]:
    """Every table under `model`, depth first, in the order the models declare them; `tagged`: `model` is
    one member of a tagged union, named by its tag field."""
    keys, nested = [], []
    tag = _variant_tag(model) if tagged else None
    for name, field in model.model_fields.items():
        sub = _models(field.annotation)
        if sub:
            nested.append((name, field, sub))
            continue
        description = _one_line(field.description)
        if not description and tag and name == tag[0]:
            description = "selects this form of the table"
        keys.append(Key(name, type_name(field.annotation, field.metadata), default_of(field), description))
    if keys and not path:
        raise ValueError("the root of the configuration holds tables only")
    out = []
    if path:
        paragraphs = tuple(p for p in (*intro, _sentence(model.__doc__)) if p)
        out.append(Table(path, paragraphs, tuple(keys), rules_of(model, path),
                         f"{tag[0]} = {tag[1]}" if tag else ""))
    for name, field, sub in nested:
        about = _sentence(field.description)
        for variant in sub:  # one model, an optional one, or each member of a tagged union
            out += tables(variant, f"{path}.{name}" if path else name, (about,), tagged=len(sub) > 1)
    return out


def render_markdown() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from the configuration models by `python -m turnstream.reference.configuration --write`; "
        "`tests/unit/test_config_reference.py` fails when this file is out of date.",
        "",
        "One TOML file configures every role, one table per section below. A key left out takes its default "
        "(the few without one are marked required, within the table that needs them). Types are strict (no `\"2\"` for 2, no `true` for 1) and an unknown key is an error that lists the known ones. `--set section.key=value` on "
        "any command overrides one key (the value is read as TOML; a bare word is a string). A bad value "
        "exits with status 2 and one line naming the key, e.g. `turnstream: config error: buffer.max_staleness: "
        "must be >= eta (2), or admitted episodes would be dropped as stale`. `turnstream check --config FILE` "
        "validates a file, runs the pre-flight checks that need role code (the environment's name and "
        "arguments, a turn's time limits against `buffer.episode_timeout_s`, the rate limiter's deadlock rule, the "
        "CURVE keys) and prints the resolved configuration.",
        "",
        "Ports left at 0 are chosen by the launcher, which writes the resolved file to "
        "`<run_dir>/config.resolved.toml` and hands it to every role.",
        "",
    ]
    for table in tables():
        title = f"## `[{table.path}]`" + (f" with `{table.variant}`" if table.variant else "")
        lines += [title, ""]
        for paragraph in table.intro:
            lines += [paragraph, ""]
        if table.keys:
            lines += ["| key | type | default | description |", "|---|---|---|---|"]
            lines += [f"| `{k.name}` | {k.type} | {k.default} | {k.description} |" for k in table.keys]
            lines.append("")
        if table.rules:
            lines += ["Checked when the file is loaded:", "", *(f"- {rule}" for rule in table.rules), ""]
    across = rules_of(Config, "")
    if across:
        lines += ["## Rules between tables", "", *(f"- {rule}" for rule in across), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m turnstream.reference.configuration", description=__doc__)
    action = p.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="write docs/configuration.md")
    action.add_argument("--check", action="store_true", help="exit 1 if docs/configuration.md is out of date")
    args, text = p.parse_args(argv), render_markdown()
    if not (args.write or args.check):
        sys.stdout.write(text)
    elif args.write:
        DOC_PATH.write_text(text)
    elif not DOC_PATH.is_file() or DOC_PATH.read_text() != text:
        sys.stderr.write(f"{DOC_PATH} is out of date: run python -m turnstream.reference.configuration --write\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
