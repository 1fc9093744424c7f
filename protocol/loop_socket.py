"""A plain ZeroMQ socket driven by the asyncio loop, without pyzmq's per-call futures.

pyzmq's asyncio socket makes a future and a kwargs dict for every send and receive, reads socket options
to arm timers, and combines flags through Python enums. On the data path (the actor's link, the buffer's
ingest socket) that was a large share of the CPU per chunk (BENCHMARKS.md, "Data plane"). Here a send is a
plain non-blocking call, and a receiver drains every queued message, then sleeps.

libzmq's FD is edge-triggered: it signals only that the socket's state may have changed, and any operation
on the socket, a send included, can consume that signal. So this class reads the state (ZMQ_EVENTS) after
every group of sends and before every sleep, never only when the FD fires.
"""
from __future__ import annotations

import asyncio

import zmq

_MORE, _LAST = int(zmq.SNDMORE | zmq.NOBLOCK), int(zmq.NOBLOCK)
_EVENTS, _POLLIN, _POLLOUT = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.POLLOUT)


class LoopSocket:
    """Owns `sock` (a plain zmq.Socket, e.g. `ctx.socket(kind, socket_class=zmq.Socket)`); use one per loop."""

    def __init__(self, sock: zmq.Socket):
        self.sock = sock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd = -1
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()

    def _watch(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._fd = self.sock.get(zmq.FD)
            self._loop.add_reader(self._fd, self._poll)

    def _poll(self) -> int:
        events = self.sock.get(_EVENTS)
        if events & _POLLIN:
            self._readable.set()
        if events & _POLLOUT:
            self._writable.set()
        return events

    async def readable(self, timeout_s: float | None = None) -> bool:
        """True once at least one message is queued; False if none came within timeout_s (None: wait on)."""
        self._watch()
        deadline = None if timeout_s is None else self._loop.time() + timeout_s
        while not self._poll() & _POLLIN:
            timer = None
            if deadline is not None:
                if (left := deadline - self._loop.time()) <= 0:
                    return False
                timer = self._loop.call_later(left, self._readable.set)
            self._readable.clear()
            try:
                await self._readable.wait()
            finally:
                if timer is not None:
                    timer.cancel()
        return True

    def recv_now(self) -> list[zmq.Frame] | None:
        """The next queued message (frames kept zero-copy), or None. A multipart message arrives whole, so
        this never waits; Frame.more saves reading the RCVMORE option per frame."""
        try:
            frame = self.sock.recv(_LAST, copy=False)
        except zmq.Again:
            return None
        frames = [frame]
        while frame.more:
            frame = self.sock.recv(_LAST, copy=False)
            frames.append(frame)
        return frames

    def send_now(self, frames: list) -> bool:
        """Send one multipart message without waiting; False if the socket has no room for it (its
        high-water mark). libzmq takes a multipart message whole or refuses its first frame."""
        return self.send_many_now([frames]) == 1

    def send_many_now(self, messages: list[list]) -> int:
        """Send messages in order without waiting, up to the first that finds no room; returns how many went.
        The state is read once, after the last send: the loop cannot act on it before then anyway."""
        sent = 0
        try:
            for frames in messages:
                last = len(frames) - 1
                for i, frame in enumerate(frames):
                    self.sock.send(frame, _MORE if i < last else _LAST, copy=False)
                sent += 1
        except zmq.Again:
            pass
        finally:
            if self._loop is not None:
                self._poll()  # a send may have consumed the FD's signal of a message that came meanwhile
        return sent

    async def send(self, frames: list) -> None:
        """Send one multipart message, waiting while the socket is at its high-water mark."""
        await self.send_all([frames])

    async def send_all(self, messages: list[list]) -> None:
        """Send multipart messages in order, waiting while the socket is at its high-water mark. (A ROUTER
        drops what meets a full pipe, unless ZMQ_ROUTER_MANDATORY; then it refuses while reporting room, and
        this retries once per loop turn.)"""
        self._watch()
        while messages:
            messages = messages[self.send_many_now(messages):]
            if not messages:
                return
            self._writable.clear()
            if self._poll() & _POLLOUT:
                await asyncio.sleep(0)
            else:
                await self._writable.wait()

    def unwatch(self) -> None:
        """Stop watching the FD (before the socket closes, or when the loop that watched it ends)."""
        if self._loop is not None:
            self._loop.remove_reader(self._fd)
            self._loop = None
