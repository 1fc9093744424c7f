"""What crosses between the actor and an environment worker: length-prefixed msgpack frames over a socket pair.

Requests (actor -> worker) carry `id`, `ep` (the episode's number in that worker) and `op`:
    create {name, args}   make the environment (registry name, so plug-ins work); replies its attributes
    reset {seed, task}    replies the Reset and the attributes again (some learn theirs at reset)
    step {action}         replies the Step
    close                 closes the environment and ends the episode's thread
    cancel {target}       cancels request `target` (a call past its time limit); no reply of its own: the target
                          replies, `cancelled`, once its coroutine has stopped
Replies (worker -> actor): {id, ok: payload} or {id, error: {kind, message}}; kind `exception` for anything
that is not an EnvError. The worker's first frame is {ready: pid}.

The fields of `Reset` and `Step` cross as their declared types (a numpy reward as a float, a numpy bool as a
bool); in `Step.info`, numbers cross as numbers, sets and tuples as lists, anything else msgpack has no type for
as its repr.
"""
from __future__ import annotations

import asyncio
import numbers
import socket
import struct
import threading
from dataclasses import dataclass, fields

import msgpack

from turnstream.actors.environment import Environment, Reset, Step

HEADER = struct.Struct(">I")
MAX_FRAME = 256 << 20  # a larger length means a corrupt stream, not a message


def _plain(value: object) -> object:
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return repr(value)


def pack(message: dict) -> bytes:
    body = msgpack.packb(message, use_bin_type=True, default=_plain)
    return HEADER.pack(len(body)) + body


def unpack(body: bytes) -> dict:
    return msgpack.unpackb(body, raw=False, strict_map_key=False)  # Step.rewards has int keys


class SyncWire:
    """The worker's end: blocking reads on the main thread, sends from any episode's thread."""

    def __init__(self, sock: socket.socket):
        self.sock, self._file, self._lock = sock, sock.makefile("rb"), threading.Lock()

    def recv(self) -> dict | None:
        """The next frame, or None once the actor's end is closed."""
        header = self._file.read(HEADER.size)
        if len(header) < HEADER.size:
            return None
        (size,) = HEADER.unpack(header)
        body = self._file.read(size) if size <= MAX_FRAME else b""
        return unpack(body) if len(body) == size else None

    def send(self, message: dict) -> None:
        data = pack(message)
        with self._lock:
            self.sock.sendall(data)


async def read_frame(reader) -> dict | None:
    """The next frame from an asyncio StreamReader, or None at end of stream."""
    try:
        (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
        if size > MAX_FRAME:
            return None
        return unpack(await reader.readexactly(size))
    except (asyncio.IncompleteReadError, OSError, ValueError):  # closed, reset, or not msgpack: the end either way
        return None


@dataclass
class EnvAttributes:
    """The attributes the environment loop and the guard read from an environment."""

    action_tokens: list[str] | None
    max_action_tokens: int
    num_agents: int
    num_tasks: int | None
    reset_timeout_s: float | None
    step_timeout_s: float | None
    close_timeout_s: float | None

    @classmethod
    def of(cls, env: Environment) -> dict:
        return {f.name: getattr(env, f.name) for f in fields(cls)}

    @classmethod
    def apply(cls, values: dict, env: Environment) -> None:
        for f in fields(cls):
            setattr(env, f.name, values[f.name])



def reset_to_wire(reset: Reset) -> dict:
    return {"observation": str(reset.observation), "prompt_key": str(reset.prompt_key), "agent": int(reset.agent),
            "system": None if reset.system is None else str(reset.system)}


def step_to_wire(step: Step) -> dict:
    return {"observation": str(step.observation), "reward": float(step.reward), "done": bool(step.done),
            "truncated": bool(step.truncated), "info": step.info,
            "agent": None if step.agent is None else int(step.agent),
            "rewards": None if step.rewards is None else {int(a): float(r) for a, r in step.rewards.items()}}
