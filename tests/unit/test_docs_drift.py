"""The pages that map the code name all of it: a new sub-package or command that the map misses fails here.

docs/architecture.md and each package's docstring name every sub-package (`name/`), and the operations page's
command list names every command of the CLI.
"""
from __future__ import annotations

import argparse
import ast
import re
import tomllib
from pathlib import Path

import pytest

from turnstream.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
SUB_PACKAGES = [name for name in PACKAGES if name.count(".") >= 2]  # turnstream.ROLE.SUB...


def _folder(package: str) -> Path:
    """pyproject's mapping: turnstream.actors.envs is actors/envs; turnstream.inspect is turnstream/inspect."""
    parts = package.split(".")[1:]
    if parts and (ROOT / parts[0] / "__init__.py").exists():
        return ROOT.joinpath(*parts)
    return ROOT.joinpath("turnstream", *parts)


def _docstring(package: str) -> str:
    return ast.get_docstring(ast.parse((_folder(package) / "__init__.py").read_text())) or ""


@pytest.mark.parametrize("package", SUB_PACKAGES)
def test_architecture_names_every_sub_package(package):
    name = package.rsplit(".", 1)[1]
    assert f"{name}/" in (ROOT / "docs" / "architecture.md").read_text(), \
        f"docs/architecture.md does not name {package} ({name}/)"


@pytest.mark.parametrize("package", [name for name in PACKAGES if name.count(".") >= 1])
def test_parent_docstring_names_every_sub_package(package):
    parent, name = package.rsplit(".", 1)
    assert f"{name}/" in _docstring(parent), f"the docstring of {parent} does not name its sub-package {name}/"


def test_operations_page_lists_every_command():
    page = (ROOT / "docs" / "operations.md").read_text()
    section = page.split("## Commands", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^turnstream ([a-z-]+)", section, re.M))
    (commands,) = [action.choices for action in build_parser()._actions
                   if isinstance(action, argparse._SubParsersAction)]
    missing = sorted(set(commands) - listed)
    assert not missing, f"docs/operations.md's command list misses: {', '.join(missing)}"
