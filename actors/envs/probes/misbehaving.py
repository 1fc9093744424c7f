"""Environments that misbehave on purpose, for the guard's tests and `turnstream bench envs`.

Each is `trivial` (a fixed prompt, `turns` free-text turns, reward 0; the well-behaved baseline with the same
args) plus one fault, drawn from the reset seed, so that a seed misbehaves the same way every time:

    probe_hang       one step in `every` (default 50) does not return for `hang_s` (default 3600): awaiting,
                     or with `blocking = true` in `time.sleep` (which no cancellation interrupts)
    probe_block      every step blocks its thread for `block_s` (default 0.05) in `time.sleep`: on the actor's
                     loop, every episode waits
    probe_crash      one episode in `every` (default 100) kills its process at its first step: `how` = segfault
                     (reads address 0, as a broken C extension would), abort, or exit
    probe_slow_tool  every step waits like a tool call of long-tailed latency: `median_s` (default 0.5), and one
                     step in `tail_every` (default 10) `tail_factor` (default 10) times that; `blocking = true`
                     waits in `time.sleep` instead of awaiting
    probe_memory     every step allocates (and touches) `mb_per_step` MiB (default 64), held until close
    probe_child      every reset starts a child process (`sleep`), its pid the observation ("child <pid>"), and
                     every step blocks in `time.sleep` for `block_s` (default 3600): what a worker leaves behind

All take trivial's `turns` (default 1), `max_action_tokens` (16) and `prompt`.
"""
from __future__ import annotations

import asyncio
import ctypes
import os
import random
import signal
import subprocess
import time

from turnstream.actors.environment import Reset, Step, register
from turnstream.actors.envs.probes.trivial import Trivial


class Misbehaving(Trivial):
    """Trivial with a fault before each step; `rng` is seeded by the reset."""

    def __init__(self, turns: int = 1, max_action_tokens: int = 16, prompt: str = "say something"):
        super().__init__(turns, max_action_tokens, prompt)
        self.rng = random.Random(0)

    async def reset(self, seed: int) -> Reset:
        self.rng = random.Random(seed)
        return await super().reset(seed)

    async def step(self, action: str) -> Step:
        await self.misbehave()
        return await super().step(action)

    async def misbehave(self) -> None:
        raise NotImplementedError


@register("probe_hang")
class Hang(Misbehaving):
    def __init__(self, every: int = 50, hang_s: float = 3600.0, blocking: bool = False, **trivial):
        super().__init__(**trivial)
        self.every, self.hang_s, self.blocking = every, hang_s, blocking

    async def misbehave(self) -> None:
        if self.rng.randrange(self.every) == 0:
            if self.blocking:
                time.sleep(self.hang_s)
            else:
                await asyncio.sleep(self.hang_s)


@register("probe_block")
class Block(Misbehaving):
    def __init__(self, block_s: float = 0.05, **trivial):
        super().__init__(**trivial)
        self.block_s = block_s

    async def misbehave(self) -> None:
        time.sleep(self.block_s)


@register("probe_crash")
class Crash(Misbehaving):
    def __init__(self, every: int = 100, how: str = "segfault", **trivial):
        super().__init__(**trivial)
        if how not in ("segfault", "abort", "exit"):
            raise ValueError(f"probe_crash: how must be segfault, abort or exit, got {how!r}")
        self.every, self.how = every, how
        self.doomed = False

    async def reset(self, seed: int) -> Reset:
        reset = await super().reset(seed)
        self.doomed = self.rng.randrange(self.every) == 0
        return reset

    async def misbehave(self) -> None:
        if not self.doomed:
            return
        if self.how == "segfault":
            ctypes.string_at(0)
        elif self.how == "abort":
            os.kill(os.getpid(), signal.SIGABRT)
        os._exit(3)


@register("probe_slow_tool")
class SlowTool(Misbehaving):
    def __init__(self, median_s: float = 0.5, tail_every: int = 10, tail_factor: float = 10.0,
                 blocking: bool = False, **trivial):
        super().__init__(**trivial)
        self.median_s, self.tail_every, self.tail_factor, self.blocking = median_s, tail_every, tail_factor, blocking

    async def misbehave(self) -> None:
        wait_s = self.median_s * (self.tail_factor if self.rng.randrange(self.tail_every) == 0 else 1.0)
        if self.blocking:
            time.sleep(wait_s)
        else:
            await asyncio.sleep(wait_s)


@register("probe_memory")
class Memory(Misbehaving):
    def __init__(self, mb_per_step: int = 64, **trivial):
        super().__init__(**trivial)
        self.mb_per_step = mb_per_step
        self.held: list[bytes] = []

    async def misbehave(self) -> None:
        self.held.append(b"\x01" * (self.mb_per_step << 20))  # written, so resident (zeroed pages may not be)

    async def close(self) -> None:
        self.held.clear()


@register("probe_child")
class Child(Misbehaving):
    def __init__(self, block_s: float = 3600.0, **trivial):
        super().__init__(**trivial)
        self.block_s = block_s

    async def reset(self, seed: int) -> Reset:
        await super().reset(seed)
        child = subprocess.Popen(["sleep", "1000"], stdin=subprocess.DEVNULL)
        return Reset(observation=f"child {child.pid}", prompt_key="child")

    async def misbehave(self) -> None:
        time.sleep(self.block_s)
