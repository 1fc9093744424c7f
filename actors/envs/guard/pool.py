"""The actor's environment workers (env.isolation = "process"): child processes that run its environments.

Each episode is opened in the least loaded worker and stays there. A worker that goes costs only the episodes it
was serving, each abandoned with a reason on its next call, and is replaced at once:
    died     it exited or was killed by a signal (a segfault in a C extension): episodes `worker_died`
    memory   its resident memory passed env.worker_memory_mb; the pool killed it: episodes `worker_memory`
    hung     a call past its time limit did not stop when cancelled (blocking code cannot be interrupted): that
             episode is abandoned as `timeout`; the worker takes no new episodes, is replaced at once, and is
             killed once its other episodes have finished (they are not cut short)
Workers are the actor's children, each the leader of a process group of its own, which holds the processes its
environments start: the pool kills a worker by killing its whole group, so that nothing an environment started
outlives it. They go when the pool closes (the actor's event loop ends, on a graceful stop or SIGTERM too), and
when the actor dies (worker.py).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from turnstream.actors.environment import EnvError
from turnstream.actors.envs.guard.settings import GuardSettings
from turnstream.actors.envs.guard.wire import pack, read_frame
from turnstream.actors.envs.waiting import not_waiting
from turnstream.actors.metrics import ActorMetrics

log = logging.getLogger("turnstream.actor")

WORKER_MODULE = "turnstream.actors.envs.guard.worker"
CANCEL_GRACE_S = 2.0  # a cancelled call that has not stopped after this is stuck in blocking code
START_TIMEOUT_S = 60.0  # a worker that has not said it is ready by then is killed and replaced
MEMORY_POLL_S = 0.25
# a worker that dies before it says it is ready (it cannot start: an import error, no memory) is replaced after this
# long, so that a worker that can never start is not restarted in a storm. One that was serving is replaced at once:
# its episodes' environment crashed it, and every moment without it piles the actor's episodes onto the others
CANNOT_START_DELAY_S = 1.0
STOP_GRACE_S = 2.0  # how long a worker whose socket has closed gets to exit on its own before SIGKILL
EPISODE_KIND = {"died": "worker_died", "memory": "worker_memory", "hung": "worker_died"}


@dataclass(eq=False)
class Worker:
    """One worker process and what the pool knows of it."""

    proc: subprocess.Popen
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    ready: bool = False
    came_up: bool = False  # it said it was ready once
    retired: bool = False  # takes no new episodes (it has a stuck one); killed once the others have finished
    kill_reason: str | None = None  # why the pool killed it (memory, hung); None: it went on its own
    gone: EnvError | None = None  # once it is gone: why, for its episodes' calls (failure())
    pending: dict[int, asyncio.Future] = field(default_factory=dict)  # request id -> its reply
    episodes: set[int] = field(default_factory=set)  # open episodes
    stuck: set[int] = field(default_factory=set)  # episodes whose cancelled call never stopped
    cancelling: dict[int, asyncio.Task] = field(default_factory=dict)  # episode -> did its cancelled call stop?

    @property
    def pid(self) -> int:
        return self.proc.pid

    def serving(self) -> bool:
        return self.ready and not self.retired and self.gone is None and self.kill_reason is None

    def failure(self) -> EnvError:
        assert self.gone is not None
        return EnvError(str(self.gone), self.gone.kind)

    def abandon(self, gone: EnvError) -> None:
        """It is gone: every call waiting on it fails with `gone`."""
        self.gone = gone
        for reply in self.pending.values():
            if not reply.done():
                reply.set_exception(self.failure())
        self.pending.clear()
        self.writer.close()


class WorkerPool:
    def __init__(self, settings: GuardSettings, metrics: ActorMetrics):
        self.settings, self.metrics = settings, metrics
        self.workers: list[Worker] = []  # started and not yet gone
        self.closed = False
        self._ids = itertools.count()
        self._changed = asyncio.Condition()
        self._tasks: set[asyncio.Task] = set()

    @classmethod
    async def start(cls, settings: GuardSettings, metrics: ActorMetrics) -> WorkerPool:
        """A pool whose workers have started (or failed to: they are being replaced)."""
        pool = cls(settings, metrics)
        # all at once, and all before the first episode: episodes opened meanwhile would all go to the first
        await asyncio.gather(*(pool._spawn() for _ in range(settings.worker_count())))
        if settings.worker_memory_mb:
            pool._background(pool._watch_memory())
        return pool

    # -- episodes -----------------------------------------------------------------------------------------------

    async def open(self, name: str, args: dict) -> tuple[Worker, int, dict]:
        """(worker, episode, attributes) of environment `name` made with `args` in the least loaded worker."""
        async with self._changed:
            with not_waiting():  # for a worker to serve it: no environment call yet (actors/envs/waiting.py)
                await self._changed.wait_for(lambda: any(w.serving() for w in self.workers))
            worker = min((w for w in self.workers if w.serving()), key=lambda w: len(w.episodes))
        ep = next(self._ids)
        worker.episodes.add(ep)
        try:
            attrs = await self.call(worker, ep, "create", name=name, args=args)
        except BaseException:  # no environment reaches the caller, so nobody else closes this episode
            self._background(self.close_episode(worker, ep))
            raise
        return worker, ep, attrs

    async def call(self, worker: Worker, ep: int, op: str, **payload):
        """The reply to request `op` of episode `ep`; an `EnvError` when the environment failed (kind
        `exception` for a plain exception) or the worker is gone. Cancelled (a time limit), the call is cancelled
        in the worker too, and a worker where it does not stop is retired."""
        if worker.gone is not None:
            raise worker.failure()
        rid = next(self._ids)
        reply = worker.pending[rid] = asyncio.get_running_loop().create_future()
        worker.writer.write(pack({"id": rid, "ep": ep, "op": op, **payload}))
        try:
            answer = await reply
        except asyncio.CancelledError:
            self._cancel(worker, ep, rid)
            raise
        if "error" in answer:
            raise EnvError(answer["error"]["message"], answer["error"]["kind"])
        return answer["ok"]

    async def close_episode(self, worker: Worker, ep: int) -> None:
        """Close episode `ep`'s environment in its worker, unless it is stuck there or the worker is gone."""
        try:
            cancelling = worker.cancelling.pop(ep, None)
            stuck = await cancelling if cancelling is not None else False
            if not stuck and worker.gone is None:
                await self.call(worker, ep, "close")
        except EnvError:
            if worker.gone is None:
                raise  # the environment's close failed; one whose worker went has nothing left to close
        finally:
            worker.episodes.discard(ep)
            self._kill_if_drained(worker)

    def _cancel(self, worker: Worker, ep: int, rid: int) -> None:
        if worker.gone is not None:
            return
        answer = worker.pending[rid] = asyncio.get_running_loop().create_future()
        worker.writer.write(pack({"id": rid, "ep": ep, "op": "cancel", "target": rid}))
        worker.cancelling[ep] = self._background(self._stopped_within_grace(worker, ep, answer))

    async def _stopped_within_grace(self, worker: Worker, ep: int, answer: asyncio.Future) -> bool:
        """True (stuck) when the cancelled call did not answer within CANCEL_GRACE_S, or the worker went."""
        try:
            await asyncio.wait_for(answer, CANCEL_GRACE_S)
            return False
        except EnvError:
            return True
        except TimeoutError:
            worker.stuck.add(ep)
            self._retire(worker)
            return True

    def _retire(self, worker: Worker) -> None:
        if worker.retired:
            return
        worker.retired = True
        log.warning("environment worker %d: a call past its time limit is stuck in blocking code; the worker takes "
                    "no new episodes, is killed once its other %d have finished, and is replaced now", worker.pid,
                    len(worker.episodes - worker.stuck))
        self._background(self._spawn())

    def _kill_if_drained(self, worker: Worker) -> None:
        if worker.retired and worker.gone is None and not (worker.episodes - worker.stuck):
            self._kill(worker, "hung")

    # -- workers ------------------------------------------------------------------------------------------------

    async def _spawn(self, delay_s: float = 0.0) -> None:
        await asyncio.sleep(delay_s)
        if self.closed:
            return
        ours, theirs = socket.socketpair()
        try:
            # started on this (the loop's) thread, the one whose end the worker's PDEATHSIG follows. A plain Popen
            # reaped by its own pid: asyncio's child watcher can report a sibling's exit status as unknown (255)
            proc = subprocess.Popen([sys.executable, "-m", WORKER_MODULE, str(theirs.fileno()), str(os.getpid())],
                                    pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, process_group=0)
        except OSError as exc:  # no process could be made (out of memory, pids): try again a little later
            ours.close()
            log.warning("environment worker could not start: %r", exc)
            self._background(self._spawn(CANNOT_START_DELAY_S))
            return
        finally:
            theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        worker = Worker(proc, reader, writer)
        self.workers.append(worker)
        self.metrics.env_workers_alive.set(len(self.workers))
        try:
            worker.ready = await asyncio.wait_for(read_frame(worker.reader), START_TIMEOUT_S) is not None
        except TimeoutError:
            worker.ready = False
        worker.came_up = worker.ready
        if worker.ready:
            async with self._changed:
                self._changed.notify_all()
        self._background(self._serve(worker))

    async def _serve(self, worker: Worker) -> None:
        """Hand each reply to its caller until the worker's end of the socket closes, then see it off."""
        if worker.ready:
            while (answer := await read_frame(worker.reader)) is not None:
                reply = worker.pending.pop(answer["id"], None)
                if reply is not None and not reply.done():
                    reply.set_result(answer)
        worker.ready = False  # its end closed: it takes no new episodes while it exits
        await self._gone(worker)

    async def _gone(self, worker: Worker) -> None:
        # its end closed, so it is exiting; one that lives on (a broken stream, it never said ready) is killed
        code = await exit_status(worker.proc, STOP_GRACE_S)
        kill_group(worker.proc)  # what its environments started, left behind by a worker that crashed
        reason = worker.kill_reason or "died"
        how = describe_exit(code)
        worker.abandon(EnvError(f"environment worker {worker.pid} {how} ({reason})", EPISODE_KIND[reason]))
        if worker in self.workers:  # not if the pool closed meanwhile
            self.workers.remove(worker)
        self.metrics.env_workers_alive.set(len(self.workers))
        if self.closed:
            return
        self.metrics.env_worker_restarts.labels(reason).inc()
        lost = len(worker.episodes - worker.stuck)  # the stuck ones were abandoned at their time limit
        log.warning("environment worker %d %s (%s)%s; %s", worker.pid, how, reason,
                    f": its {lost} open episodes are abandoned" if lost else "",
                    "replaced by the one started when it was retired" if worker.retired else "replacing it")
        if not worker.retired:
            self._background(self._spawn(0.0 if worker.came_up else CANNOT_START_DELAY_S))

    def _kill(self, worker: Worker, reason: str) -> None:
        if worker.kill_reason is None and worker.proc.returncode is None:
            worker.kill_reason = reason
            kill_group(worker.proc)

    async def _watch_memory(self) -> None:
        limit = self.settings.worker_memory_mb << 20
        while True:
            await asyncio.sleep(MEMORY_POLL_S)
            for worker in list(self.workers):
                rss = resident_bytes(worker.pid)
                if rss > limit and worker.kill_reason is None:
                    log.warning("environment worker %d uses %d MiB, over env.worker_memory_mb = %d: killing it",
                                worker.pid, rss >> 20, self.settings.worker_memory_mb)
                    self._kill(worker, "memory")

    def _background(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)  # held: the loop keeps only weak references to its tasks
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        """Stop every worker: the end of its socket, then SIGKILL for one that has not exited by STOP_GRACE_S."""
        if self.closed:
            return
        self.closed = True
        for task in list(self._tasks):
            task.cancel()
        workers, self.workers = self.workers, []
        for worker in workers:  # the end of its socket: the worker exits
            worker.abandon(EnvError("the actor is stopping its environment workers", "worker_died"))
        await asyncio.gather(*(exit_status(worker.proc, STOP_GRACE_S) for worker in workers))
        self.metrics.env_workers_alive.set(0)


async def exit_status(proc: subprocess.Popen, grace_s: float) -> int:
    """`proc`'s exit status, once it exits, or is killed with its group after `grace_s`."""
    deadline = time.monotonic() + grace_s
    while (code := proc.poll()) is None:
        if time.monotonic() >= deadline:
            kill_group(proc)
        await asyncio.sleep(0.01)
    return code


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to the process group `proc` leads (a worker, and every process its environments started); a
    group whose last member has gone is left alone."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def describe_exit(code: int) -> str:
    if code >= 0:
        return f"exited with {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:  # a real-time signal has no name
        return f"killed by signal {-code}"


def resident_bytes(pid: int) -> int:
    """A process's resident memory (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return 0
