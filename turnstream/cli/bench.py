"""`turnstream bench NAME [args]`: runs a benchmark of the source checkout's benchmarks/ folder.

The benchmarks are not part of the installed package: they live in the checkout, beside the package's source
(an editable install) or in the current directory, as the plain package `benchmarks` (each module
`benchmarks/<name>.py` has `main(argv) -> int`), imported with the checkout's root on the import path.
"""
from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

from turnstream.core.configtools import ConfigError

FOLDER = "benchmarks"
NOT_IN_A_CHECKOUT = f"bench: {FOLDER}/ is not here: `turnstream bench` runs from a source checkout"
# the turnstream package's folder: in an editable install, the checkout's turnstream/
PACKAGE_DIR = Path(__file__).resolve().parents[1]
ALIASES = {"async": "async_vs_sync"}  # `async` is a Python keyword


def checkout_places() -> tuple[Path, ...]:
    """Where a checkout's root may be: above the package's source, then the current directory."""
    return PACKAGE_DIR.parent, Path.cwd()


def find_checkout(places: Sequence[Path]) -> Path | None:
    """The first of `places` that holds the benchmarks package (its __init__.py), or None."""
    return next((place for place in places if (place / FOLDER / "__init__.py").is_file()), None)


def module_name(benchmark: str) -> str:
    return f"{FOLDER}.{ALIASES.get(benchmark, benchmark.replace('-', '_'))}"


def run_benchmark(benchmark: str, argv: list[str]) -> int:
    root = find_checkout(checkout_places())
    if root is None:
        print(NOT_IN_A_CHECKOUT, file=sys.stderr)
        return 1
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    name = module_name(benchmark)
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        raise ConfigError(f"bench: no benchmark named {benchmark!r} (see {root / FOLDER})") from None
    return module.main(argv)
