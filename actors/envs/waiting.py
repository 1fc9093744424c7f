"""The mark an episode carries while it waits on its environment, for whoever counts such waits (the runner's
gate, actors/play/in_flight.py, which starts another episode in place of one that waits).

A wait for room to run the environment at all (with `env.isolation = "process"` and every worker down) is no
environment call: counted as one, it would let episodes pile up while the workers are replaced, all of them to
land on the next worker that comes up (and die with it, if the environment crashes workers). The environment's
host wraps such a wait in `not_waiting()`.
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Iterator, Protocol


class WaitMark(Protocol):
    def pause(self) -> None: ...

    def resume(self) -> None: ...


_mark: ContextVar[WaitMark | None] = ContextVar("turnstream_env_wait_mark", default=None)


@contextlib.contextmanager
def carrying(mark: WaitMark) -> Iterator[None]:
    """Inside, the calling task's episode carries `mark`."""
    token = _mark.set(mark)
    try:
        yield
    finally:
        _mark.reset(token)


@contextlib.contextmanager
def not_waiting() -> Iterator[None]:
    """Inside, the calling episode is not counted as waiting on its environment."""
    mark = _mark.get()
    if mark is None:
        yield
        return
    mark.pause()
    try:
        yield
    finally:
        mark.resume()
