"""Objects every episode of an actor shares, one per running event loop: the agents' OpenAI endpoint, the
verifiers harness workers, the http environment's connection pool.

Keyed by the loop, weakly: an object bound to one loop (a server, a subprocess's pipes, a connection pool)
cannot serve another, and tests run loop after loop (asyncio.run each). Each is made on first use, under the
loop's lock so that episodes starting together make one, made again when the last one is no longer alive,
and closed when its loop ends.
"""
from __future__ import annotations

import asyncio
import functools
import weakref
from typing import Awaitable, Callable, Generic, Hashable, TypeVar

T = TypeVar("T")

_holders: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list]" = weakref.WeakKeyDictionary()


class LoopShared(Generic[T]):
    """`alive(obj)`: whether the object made last can still serve; `close(obj)`: awaited when the loop ends."""

    def __init__(self, name: str, *, alive: Callable[[T], bool] = lambda obj: True,
                 close: Callable[[T], Awaitable] | None = None):
        self.name, self.alive, self.close = name, alive, close
        self._objects: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict]" = weakref.WeakKeyDictionary()
        self._locks: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock]" = \
            weakref.WeakKeyDictionary()

    async def get(self, make: Callable[[], Awaitable[T]], key: Hashable = None) -> T:
        """This loop's object for `key`, made by `make` when there is none alive (a failed `make` leaves none)."""
        loop = asyncio.get_running_loop()
        async with self._locks.setdefault(loop, asyncio.Lock()):
            objects = self._objects.setdefault(loop, {})
            obj = objects.get(key)
            if obj is None or not self.alive(obj):
                obj = objects[key] = await make()
                if self.close is not None:
                    close_with_loop(functools.partial(self.close, obj), name=self.name)
        return obj

    def pop(self, key: Hashable = None) -> T | None:
        """This loop's object for `key`, forgotten (for a caller that closes it before the loop ends)."""
        return self._objects.get(asyncio.get_running_loop(), {}).pop(key, None)


def close_with_loop(close: Callable[[], Awaitable], name: str) -> None:
    """Runs `close` when the running loop ends: asyncio.run cancels the tasks left, this holder included (an
    aiohttp connection pool left open is reported as a leak when it is collected; a harness worker left
    running would outlive the loop)."""
    async def hold() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await close()

    # held here: the loop keeps only weak references to its tasks
    _holders.setdefault(asyncio.get_running_loop(), []).append(asyncio.create_task(hold(), name=name))
