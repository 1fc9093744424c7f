"""The project as users install it: a wheel in a fresh virtual environment, used from outside the checkout.

pip installs the wheel with its declared dependencies and nothing else, so an import of a package the wheel
does not declare (directly or through a declared one) fails here. It resolves them the way the set-up did (pip's
own configuration: its indexes, local wheel directories and cache), pinned to the versions the test environment
has: the test checks the declared list against the releases the other tests run, not against newer ones.
"""
from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

from turnstream.cli.bench import NOT_IN_A_CHECKOUT

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
ROLES = ("actors", "buffer", "learner", "protocol", "core")
# names the wheel must not install at the top level: the roles, and the checkout's benchmarks
BARE = (*ROLES, "benchmarks")

IMPORT_EVERYTHING = r"""
import importlib, json, pkgutil, sys
import turnstream
names = [m.name for m in pkgutil.walk_packages(turnstream.__path__, "turnstream.")]
for name in names:
    importlib.import_module(name)
shadowed = []
for bare in sys.argv[1].split(","):
    try:
        importlib.import_module(bare)
        shadowed.append(bare)
    except ImportError:
        pass
print(json.dumps({"file": turnstream.__file__, "modules": names, "shadowed": shadowed}))
"""


def pinned_versions() -> str:
    """Constraints: every distribution of the test environment at its version, but those pip cannot fetch by
    version from an index (the checkout's editable install, anything installed from a path or URL)."""
    pins: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
        if name != "turnstream" and dist.read_text("direct_url.json") is None:
            pins.setdefault(name, f"{name}=={dist.version}")
    return "\n".join(sorted(pins.values())) + "\n"


def run(argv: list, cwd: Path) -> str:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{argv[:4]} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the fresh environment's python, a working directory outside the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"  # a copy: building writes build/ and *.egg-info next to the sources
    for folder in PYPROJECT["tool"]["setuptools"]["package-dir"].values():
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp / "dist",
         source], cwd=tmp)
    (wheel,) = (tmp / "dist").glob("turnstream-*.whl")
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    constraints = tmp / "constraints.txt"
    constraints.write_text(pinned_versions())
    # --no-compile: the imports below compile only the modules they load, not all of torch's
    run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-compile", "-c", constraints,
         wheel], cwd=tmp)
    work = tmp / "elsewhere"
    work.mkdir()
    return python, work


def test_every_module_imports_from_the_wheel_under_one_name(installed):
    python, work = installed
    report = json.loads(run([python, "-c", IMPORT_EVERYTHING, ",".join(BARE)], cwd=work).splitlines()[-1])
    assert not Path(report["file"]).is_relative_to(ROOT), "turnstream was imported from the checkout"
    for role in ROLES:
        assert f"turnstream.{role}" in report["modules"]
    assert {"turnstream.learner.step.trainer", "turnstream.buffer.store.replay_store", "turnstream.actors.envs.registry",
            "turnstream.actors.envs.adapters.textarena_env", "turnstream.core.config"} <= set(report["modules"])
    assert report["shadowed"] == [], "bare top-level packages must not be installed"
    assert "turnstream.bench" not in report["modules"], "benchmarks stay in the checkout"


def test_the_installed_cli_lists_shipped_and_plugin_environments(installed):
    python, work = installed
    out = run([python.parent / "turnstream", "envs"], cwd=work)
    names = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert {"follow_signs", "goal_walk", "tictactoe"} <= names  # shipped
    assert {"textarena", "textworld", "reasoning_gym", "gymnasium", "agent", "verifiers"} <= names  # entry points of the wheel


def test_the_installed_cli_says_benchmarks_run_from_a_checkout(installed):
    python, work = installed
    done = subprocess.run([python.parent / "turnstream", "bench", "dataplane"], cwd=work, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [NOT_IN_A_CHECKOUT]
