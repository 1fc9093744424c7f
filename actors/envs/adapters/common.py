"""What every library adapter shares: finding its library, a one-line description that says whether the
library is installed, and turning a library's exceptions into `EnvError`s so a crashed game abandons one
episode with a counted reason instead of taking the actor down."""
from __future__ import annotations

import importlib
import importlib.util
from contextlib import contextmanager
from types import ModuleType
from typing import Iterator

from turnstream.actors.environment import EnvError

# `turnstream_actor_env_errors_total{kind}` label for an exception raised inside library code
LIBRARY_ERROR = "library"


class LibraryNotInstalled(ImportError, ValueError):
    """The adapter's library is missing. A ValueError too, so config validation reports it as a bad
    `env` section (one line, exit status 2) instead of a traceback."""


def installed(module: str) -> bool:
    """Whether `module` can be imported, without importing it (listing adapters must stay cheap)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def install_hint(extra: str) -> str:
    return f"pip install turnstream[{extra}]"


def require(module: str, extra: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise LibraryNotInstalled(f"{module} is not installed: {install_hint(extra)} ({exc})") from None


def describe(summary: str, module: str, extra: str) -> str:
    return summary if installed(module) else f"{summary} (not installed: {install_hint(extra)})"


@contextmanager
def library_errors(library: str, what: str) -> Iterator[None]:
    """Any exception from the library while doing `what` becomes an EnvError of kind `library`."""
    try:
        yield
    except EnvError:
        raise
    except Exception as exc:
        raise EnvError(f"{library}: {what} failed: {type(exc).__name__}: {exc}", LIBRARY_ERROR) from exc


def check_task(library: str, task: int, num_tasks: int | None) -> int:
    """`task`, if the adapter enumerates it: the task source only names tasks in [0, num_tasks), so any other
    is a caller's bug, not a failed episode."""
    if not num_tasks or not 0 <= task < num_tasks:
        raise ValueError(f"{library}: task {task} out of range [0, {num_tasks or 0})")
    return task
