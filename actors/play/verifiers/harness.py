"""The actor's side of a verifiers harness worker (actors/play/verifiers/worker.py): a subprocess in another
Python, spoken to in JSON lines over its stdin/stdout, that plays rollouts against the actor's endpoint.

One worker per actor process and environment, shared by every episode (loading an environment can take
seconds): started by the first episode, started afresh by the next one after it died, stopped when the
actor's event loop ends (or, since it exits on end of input, when the actor dies). A rollout's failure, the
worker's death or a malformed answer fails only the episodes waiting on it (HarnessError, with a reason for
the actor's error counter).
"""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import subprocess
from pathlib import Path

from turnstream.actors.loop_shared import LoopShared
from turnstream.actors.play.endpoint.session import AgentFailed

log = logging.getLogger("turnstream.actor")

SCRIPT = Path(__file__).with_name("worker.py")
START_TIMEOUT_S = 300.0  # loading an environment may build its dataset


class HarnessError(AgentFailed):
    """A rollout the harness could not score; `reason` labels turnstream_actor_agent_errors_total."""


def describe(python: str, spec: dict, timeout_s: float = START_TIMEOUT_S) -> dict:
    """The worker's ready line ({"num_tasks", "verifiers"}) from a run that loads the environment and exits;
    ValueError with the worker's one-line reason when it cannot serve it."""
    try:
        done = subprocess.run([python, str(SCRIPT), json.dumps(spec), "--describe"], capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ValueError(f"{python} took over {timeout_s:.0f} s to load the environment") from None
    except OSError as exc:
        raise ValueError(f"cannot run {python}: {exc.strerror}") from None
    return _ready(done.stdout.splitlines()[:1], done.stderr)


def _ready(first: list, stderr: str) -> dict:
    try:
        line = json.loads(first[0])
    except (IndexError, ValueError):
        tail = stderr.strip().splitlines()[-1:] or ["no output"]
        raise ValueError(f"the harness worker failed to start: {tail[0]}") from None
    if "fatal" in line:
        raise ValueError(line["fatal"])
    return line["ready"]


class HarnessProcess:
    def __init__(self, python: str, spec: dict):
        self.python, self.spec = python, spec
        self.proc: asyncio.subprocess.Process | None = None
        self.pending: dict[int, asyncio.Future] = {}
        self.ids = itertools.count()
        self._reader: asyncio.Task | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None and not self._reader.done()

    async def start(self) -> "HarnessProcess":
        # stderr is the actor's: the environment's logs and tracebacks land in the actor's log
        self.proc = await asyncio.create_subprocess_exec(
            self.python, str(SCRIPT), json.dumps(self.spec), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, limit=1 << 26)
        try:
            first = await asyncio.wait_for(self.proc.stdout.readline(), START_TIMEOUT_S)
            ready = _ready([first] if first else [], "see the actor's log")
        except (ValueError, asyncio.TimeoutError) as exc:
            await self.close()
            raise HarnessError("harness_start", f"the verifiers harness did not start: {exc}") from None
        except asyncio.CancelledError:  # the episode that started it timed out: no worker left behind
            await self.close()
            raise
        log.info("verifiers harness worker (pid %d, verifiers %s) serves %d tasks", self.proc.pid,
                 ready["verifiers"], ready["num_tasks"])
        self._reader = asyncio.create_task(self._read(), name="verifiers-harness")
        return self

    async def _read(self) -> None:
        while line := await self.proc.stdout.readline():
            try:
                answer = json.loads(line)
                future = self.pending.pop(answer["id"], None)
            except (ValueError, KeyError, TypeError):
                log.warning("verifiers harness: a malformed answer: %.200r", line)
                continue
            if future is not None and not future.done():
                future.set_result(answer)
        for future in self.pending.values():  # the worker is gone: whoever waits on it fails, not the actor
            if not future.done():
                future.set_exception(HarnessError("harness_exited", "the verifiers harness worker exited"))
        self.pending.clear()

    async def rollout(self, base_url: str, task: int, model: str, sampling_args: dict) -> float:
        """The rubric's score of one rollout of `task` against `base_url`."""
        request_id = next(self.ids)
        future = self.pending[request_id] = asyncio.get_running_loop().create_future()
        request = {"id": request_id, "base_url": base_url, "task": task, "model": model,
                   "sampling_args": sampling_args}
        try:
            await self._write(request)
            answer = await future
        except asyncio.CancelledError:  # the episode timed out or the actor stops: the worker drops it too
            self.pending.pop(request_id, None)
            if self.alive:
                await self._write({"cancel": request_id})
            raise
        if "reward" not in answer:
            raise HarnessError(str(answer.get("reason", "harness_error")), str(answer.get("error", answer)))
        return float(answer["reward"])

    async def _write(self, message: dict) -> None:
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            await self.proc.stdin.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise HarnessError("harness_exited", f"the verifiers harness worker is gone: {exc}") from None

    async def close(self, timeout_s: float = 5.0) -> None:
        """End of input asks the worker to exit; one that does not is killed (by its own pid)."""
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), timeout_s)
        except asyncio.TimeoutError:
            self.proc.kill()
            await self.proc.wait()


def _alive(worker: HarnessProcess) -> bool:
    if not worker.alive:
        log.warning("verifiers harness worker %d exited (status %s); starting another", worker.proc.pid,
                    worker.proc.returncode)
    return worker.alive


_workers: "LoopShared[HarnessProcess]" = LoopShared("verifiers-harness-holder", alive=_alive,
                                                   close=HarnessProcess.close)


async def shared_harness(python: str, spec: dict) -> HarnessProcess:
    """The running worker for (python, spec) on this loop, started (again) when there is none alive."""
    return await _workers.get(lambda: HarnessProcess(python, spec).start(),
                              key=(python, json.dumps(spec, sort_keys=True)))
