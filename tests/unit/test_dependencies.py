"""Every third-party import of the package is a declared dependency: deptry, configured in pyproject.toml's
[tool.deptry], reads every import of the source (those inside functions too) and the declared lists.

A dependency that only arrives through another one (pydantic comes with transformers' command line, for one)
works until that package drops it: the wheel install test cannot see it (tests/integration/test_wheel_install.py),
deptry reports it as transitive.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("deptry") is None,
                    reason="deptry is not installed (the test extra has it: pip install -e '.[test]')")
def test_every_third_party_import_is_a_declared_dependency():
    done = subprocess.run([sys.executable, "-m", "deptry", ".", "--no-ansi"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"deptry found undeclared or unused dependencies:\n{done.stdout}\n{done.stderr}"
