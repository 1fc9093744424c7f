"""An environment worker process: `python -m turnstream.actors.envs.guard.worker FD ACTOR_PID`.

It serves the episodes the actor opens in it, each on a thread of its own running its own event loop, so an
environment that blocks (a subprocess call, `time.sleep`, a CPU-heavy check) holds up only its own episode:
sleeps and I/O release the GIL, and CPU-bound Python shares one core per worker (the pool has several). A
crash, a hang or runaway memory takes down only this process's episodes; the actor's pool replaces it.

The worker talks only to the actor, over the socket `FD` (wire.py), and imports only the environment registry:
no torch, no tokenizer. It leads a process group of its own (the pool starts it so), which holds whatever its
environments start, and it goes with that whole group: at the end of the socket (the pool closed, or the actor
exited), and when the actor dies, on the signal the kernel sends it then (PR_SET_PDEATHSIG). The actor decides
when its workers stop, after a graceful stop's open episodes have finished: SIGINT and SIGTERM are ignored.
"""
from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import socket
import sys
import threading
import traceback

from turnstream.actors.environment import EnvError, Environment
from turnstream.actors.envs.guard.wire import EnvAttributes, SyncWire, reset_to_wire, step_to_wire
from turnstream.actors.envs.registry import resolve

PR_SET_PDEATHSIG = 1


class EpisodeThread:
    """One episode's environment, on its own thread and event loop, where its requests run (one at a time: the
    actor awaits each before the next)."""

    def __init__(self, ep: int, wire: SyncWire):
        self.wire = wire
        self.loop = asyncio.new_event_loop()
        self.env: Environment | None = None
        self.calls: dict[int, asyncio.Task] = {}
        threading.Thread(target=self._serve, name=f"episode-{ep}", daemon=True).start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        # closed: end what the environment left on its loop (e.g. the http client's connection pool) as
        # asyncio.run would
        left = asyncio.all_tasks(self.loop)
        for task in left:
            task.cancel()
        self.loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()

    def submit(self, request: dict) -> None:
        self.loop.call_soon_threadsafe(self._start, request)

    def cancel(self, target: int) -> None:
        # runs only once the loop is free again: a call stuck in blocking code never sees it (the actor
        # notices the missing reply and retires the worker)
        self.loop.call_soon_threadsafe(self._cancel, target)

    def _start(self, request: dict) -> None:
        self.calls[request["id"]] = self.loop.create_task(self._run(request))

    def _cancel(self, target: int) -> None:
        if (task := self.calls.get(target)) is not None:
            task.cancel()  # it replies `cancelled` once it has stopped
        else:  # it finished before the cancel came: say so, or the actor would take the call for stuck
            self._reply(target, {"error": {"kind": "cancelled", "message": "it had already finished"}})

    async def _run(self, request: dict) -> None:
        try:
            reply = {"ok": await self._do(request)}
        except asyncio.CancelledError:
            reply = {"error": {"kind": "cancelled", "message": "cancelled past its time limit"}}
        except EnvError as exc:
            reply = {"error": {"kind": exc.kind, "message": str(exc)}}
        except Exception:
            reply = {"error": {"kind": "exception", "message": traceback.format_exc()}}
        self.calls.pop(request["id"], None)
        self._reply(request["id"], reply)
        if request["op"] == "close":
            self.loop.stop()

    def _reply(self, rid: int, reply: dict) -> None:
        try:
            self.wire.send({"id": rid, **reply})
        except OSError:  # the actor is gone
            end()

    async def _do(self, request: dict):
        op = request["op"]
        if op == "create":
            self.env = resolve(request["name"])(**request["args"])
            return EnvAttributes.of(self.env)
        if self.env is None:
            if op == "close":
                return None
            raise EnvError(f"{op} before the environment was created", "protocol")
        if op == "reset":
            seed, task = request["seed"], request["task"]
            reset = await (self.env.reset(seed) if task is None else self.env.reset(seed, task=task))
            return {"reset": reset_to_wire(reset), "attrs": EnvAttributes.of(self.env)}
        if op == "step":
            return step_to_wire(await self.env.step(request["action"]))
        if op == "close":
            return await self.env.close()
        raise EnvError(f"unknown request {op!r}", "protocol")


def end() -> None:
    """SIGKILL to this worker's process group: the worker and every process its environments started."""
    sys.stdout.flush()
    if os.getpgid(0) == os.getpid():  # never the actor's group, should this run outside its own
        os.killpg(0, signal.SIGKILL)
    os._exit(0)


def die_with(actor_pid: int) -> None:
    """The worker's group ends when the actor dies: the kernel sends SIGHUP then (Linux; elsewhere the end of
    the socket ends it). A signal the worker handles, not SIGKILL, so that it takes its group with it; the handler
    runs on the main thread, whose only work is reading the socket."""
    signal.signal(signal.SIGHUP, lambda *_: end())
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGHUP)
    except OSError:
        pass
    if os.getppid() != actor_pid:  # the actor died before the prctl took effect
        end()


def serve(wire: SyncWire) -> None:
    episodes: dict[int, EpisodeThread] = {}
    try:
        wire.send({"ready": os.getpid()})
    except OSError:  # the pool closed while this worker started
        return
    while (request := wire.recv()) is not None:
        ep, op = request["ep"], request["op"]
        if op == "cancel":
            if ep in episodes:
                episodes[ep].cancel(request["target"])
            continue
        episode = episodes.get(ep)
        if episode is None:
            episode = episodes[ep] = EpisodeThread(ep, wire)
        episode.submit(request)
        if op == "close":
            del episodes[ep]


def main(argv: list[str]) -> None:
    fd, actor_pid = int(argv[0]), int(argv[1])
    die_with(actor_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    serve(SyncWire(socket.socket(fileno=fd)))
    # the actor closed its end: episode threads stuck in blocking code must not keep the process up, nor what
    # the environments started
    end()


if __name__ == "__main__":
    main(sys.argv[1:])
