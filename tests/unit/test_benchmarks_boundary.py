"""The benchmarks stay outside the installed package and use it as a user's code does (docs/architecture.md).

benchmarks/ is a plain package of the source checkout: the wheel lists none of it, the product never imports
it, it uses no private name of the product, and tests use none of its private names.
"""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
PRODUCT_DIRS = [ROOT / folder for folder in SETUPTOOLS["package-dir"].values()]
BENCHMARKS = ROOT / "benchmarks"


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def product_files() -> list[Path]:
    return [path for folder in PRODUCT_DIRS for path in folder.rglob("*.py") if ".venv" not in path.parts]


def defined_private_names(paths: list[Path]) -> set[str]:
    """Private functions, classes, module names and attributes (`self._x = ...`) the product defines."""
    names: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return {name for name in names if is_private(name)}


def private_uses(path: Path, private_from: str, attributes: set[str] | None) -> list[str]:
    """`from <private_from>... import _x` anywhere in the file; with `attributes`, also `obj._x` for those names
    (any object but self and cls); without, `module._x` on a module the file imported from `private_from`."""
    tree = ast.parse(path.read_text())
    modules: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == private_from:
            modules.update(alias.asname or alias.name for alias in node.names)
            found += [f"{path.name}:{node.lineno} imports {node.module}.{a.name}"
                      for a in node.names if is_private(a.name)]
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not is_private(node.attr):
            continue
        owner = node.value.id if isinstance(node.value, ast.Name) else None
        if attributes is not None and node.attr in attributes and owner not in ("self", "cls"):
            found.append(f"{path.name}:{node.lineno} uses {ast.unparse(node)}")
        elif attributes is None and owner in modules:
            found.append(f"{path.name}:{node.lineno} uses {ast.unparse(node)}")
    return found


def test_the_wheel_lists_no_benchmark_package_or_folder():
    listed = [*SETUPTOOLS["packages"], *SETUPTOOLS["package-dir"], *SETUPTOOLS.get("package-data", {})]
    assert not [name for name in listed if {"bench", "benchmarks"} & set(name.split("."))]
    assert not [folder for folder in PRODUCT_DIRS if folder.is_relative_to(BENCHMARKS) or folder.name == "bench"]


def test_the_product_never_imports_the_benchmarks():
    wrong = []
    for path in product_files():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            wrong += [f"{path.relative_to(ROOT)}:{node.lineno}" for n in names if n.split(".")[0] == "benchmarks"]
    assert not wrong


def test_benchmarks_use_no_private_name_of_the_product():
    private = defined_private_names(product_files())
    assert {"_changed", "_on_message"} <= private  # the scan sees the product's private names (actors/link.py)
    wrong = [use for path in sorted(BENCHMARKS.glob("*.py")) for use in private_uses(path, "turnstream", private)]
    assert not wrong, "\n".join(wrong)


def test_tests_use_no_private_name_of_a_benchmark():
    wrong = [use for path in sorted((ROOT / "tests").rglob("*.py")) for use in private_uses(path, "benchmarks", None)]
    assert not wrong, "\n".join(wrong)


def test_the_scans_see_what_they_check(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from benchmarks import learning\nfrom benchmarks.trl import _parse\n"
                      "learning._median_of([])\nlink._changed\nself._changed\n")
    assert private_uses(sample, "benchmarks", None) == ["sample.py:2 imports benchmarks.trl._parse",
                                                         "sample.py:3 uses learning._median_of"]
    assert private_uses(sample, "turnstream", {"_changed"}) == ["sample.py:4 uses link._changed"]
