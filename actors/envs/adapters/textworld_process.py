"""One TextWorld game in a child process.

TextWorld plays `.z8` games with Jericho, which runs the Frotz interpreter inside the calling process, and
Frotz ends that process with `exit()` on a fatal interpreter error (a corrupt story file prints "Fatal
error: Unknown Z-code version" and the whole actor is gone). So each game runs in a child forked from a
forkserver that has TextWorld imported already (a fork costs milliseconds); a child that dies or hangs
becomes an `EnvError` for that one episode. The child only sees plain data: commands in, dicts out.

The child works in a scratch directory of its own, removed when the game closes: Frotz writes files into
its working directory when a command asks it to (a model's gibberish after a control character was seen
to leave files named after the next command), and those must not land in the actor's directory.
"""
from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import tempfile
from multiprocessing.connection import Connection

from turnstream.actors.environment import EnvError
from turnstream.actors.envs.adapters.common import LIBRARY_ERROR

STATE_FIELDS = ("feedback", "admissible_commands", "objective", "description", "score", "max_score", "won", "lost")
_CONTEXT = None


def _context():
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(["__main__", "textworld", "textworld.envs"])
    return _CONTEXT


def _plain(state) -> dict:
    return {name: state.get(name) for name in STATE_FIELDS}


def _serve(conn: Connection, game_file: str, infos: dict, workdir: str) -> None:
    """The child: start the game, then answer ("reset",) / ("step", command) / ("close",) until told to stop
    or the parent goes away."""
    import textworld

    os.chdir(workdir)
    env = None
    while True:
        try:
            op, arg = conn.recv()
        except (EOFError, OSError):  # the actor is gone
            return
        try:
            if env is None:
                env = textworld.start(game_file, request_infos=textworld.EnvInfos(**infos))
            if op == "reset":
                reply = {"state": _plain(env.reset())}
            elif op == "step":
                state, score, done = env.step(arg)
                reply = {"state": _plain(state), "score": score, "done": bool(done)}
            else:
                env.close()
                conn.send({})
                return
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        conn.send(reply)


class GameProcess:
    def __init__(self, game_file: str, infos: dict, timeout_s: float):
        ctx = _context()
        self.workdir = tempfile.mkdtemp(prefix="turnstream-textworld-")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, os.path.abspath(game_file), infos, self.workdir),
                                daemon=True)
        self.proc.start()
        child.close()
        self.timeout_s = timeout_s

    async def _recv(self) -> dict:
        loop = asyncio.get_running_loop()
        readable = loop.create_future()
        fd = self.conn.fileno()
        loop.add_reader(fd, lambda: readable.done() or readable.set_result(None))
        try:
            await asyncio.wait_for(readable, self.timeout_s)
        except asyncio.TimeoutError:
            self.kill()
            raise EnvError(f"textworld: the game did not answer within {self.timeout_s}s", "timeout") from None
        finally:
            loop.remove_reader(fd)
        try:
            return self.conn.recv()
        except (EOFError, OSError):  # the interpreter ended the child (Frotz's fatal errors exit)
            self.proc.join(1.0)
            raise EnvError(f"textworld: the game's interpreter died (exit code {self.proc.exitcode})",
                           LIBRARY_ERROR) from None

    async def call(self, op: str, arg=None) -> dict:
        try:
            self.conn.send((op, arg))
        except (BrokenPipeError, OSError):
            raise EnvError("textworld: the game's process is gone", LIBRARY_ERROR) from None
        reply = await self._recv()
        if "error" in reply:
            raise EnvError(f"textworld: {op} failed: {reply['error']}", LIBRARY_ERROR)
        return reply

    async def close(self) -> None:
        if self.proc.is_alive():
            try:
                self.conn.send(("close", None))
                await asyncio.wait_for(self._recv(), 5.0)
            except (EnvError, OSError, asyncio.TimeoutError):
                pass
        self.kill()
        self.conn.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(1.0)
