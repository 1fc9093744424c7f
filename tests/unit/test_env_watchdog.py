"""The guard's last resorts: the loop watchdog notices an environment call that blocks the actor's event loop past
its time limit while it still blocks (a counter, a log line naming the environment and the call, then the
recovery: the actor exits non-zero for its supervisor to restart it), and a worker killed for a stuck call takes
the processes its environment started with it."""
from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from turnstream.actors.environment import Environment, Reset, Step
from turnstream.actors.envs.guard.pool import WorkerPool
from turnstream.actors.envs.guard.settings import GuardSettings
from turnstream.actors.envs.guard.watchdog import LOOP_STALL_EXIT_STATUS, LoopWatchdog, StallRecovery, Stretch
from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.context import Sampling
from turnstream.actors.play.env_loop import EnvironmentLoop
from turnstream.actors.play.runner import EpisodeRunner
from turnstream.actors.tasks.orders import RandomOrder
from turnstream.actors.tasks.source import TaskSource
from tests.unit.fakes import CollectingLink, ScriptedClient

ROOT = Path(__file__).resolve().parents[2]


class Blocking(Environment):
    """Its step blocks its thread (the actor's loop) in `time.sleep` for `block_s`; `ended` is when it returned."""

    def __init__(self, block_s: float):
        self.block_s, self.ended = block_s, None

    async def reset(self, seed: int) -> Reset:
        return Reset("go", "blocking")

    async def step(self, action: str) -> Step:
        time.sleep(self.block_s)
        self.ended = time.time()
        return Step("go", 0.0, done=True)


class Recorded(StallRecovery):
    """Records when it was asked to recover, and what the stall counter read then, instead of exiting."""

    def __init__(self):
        self.calls: list[tuple[float, str, str, float]] = []

    def recover(self, stretch: Stretch, held_s: float) -> None:
        stalls = stretch.metrics.registry.get_sample_value("turnstream_actor_env_loop_stalls_total",
                                                           {"env": stretch.env, "call": stretch.call})
        self.calls.append((time.time(), stretch.env, stretch.call, stalls))


async def test_a_step_blocking_the_loop_past_its_limit_is_counted_logged_and_recovered_while_it_blocks(
        tiny_model, caplog):
    caplog.set_level(logging.INFO, "turnstream.actor")
    envs: list[Blocking] = []

    def make() -> Blocking:
        envs.append(Blocking(block_s=2.0))
        return envs[-1]

    recovery = Recorded()
    player = EnvironmentLoop(make, GuardSettings("blocking", step_timeout_s=0.3),
                             watchdog=LoopWatchdog(grace_s=0.3, recovery=recovery, poll_s=0.02))
    metrics = ActorMetrics()
    runner = EpisodeRunner(actor_id="a", epoch=1, player=player, chat=ChatTokens(tiny_model), client=ScriptedClient(),
                           link=CollectingLink(), sampling=Sampling(1.0, 8, 512), metrics=metrics,
                           tasks=TaskSource(RandomOrder(0)))
    # the step returns without ever yielding to the loop: past its limit, it abandons the episode all the same
    assert await runner.play("e0", seed=0) == "env_error"
    assert metrics.registry.get_sample_value("turnstream_actor_env_errors_total", {"kind": "timeout"}) == 1
    block_ended = envs[0].ended
    # the recovery ran while the step still blocked the loop, with the stall already counted
    (at, env, call, stalls), = recovery.calls
    assert (env, call, stalls) == ("blocking", "step", 1.0)
    assert at < block_ended - 0.5
    # and the log named the environment and the call before the block ended
    noticed = [r for r in caplog.records if "past its 0.3s limit, and still holds it" in r.getMessage()]
    assert len(noticed) == 1 and "environment blocking" in noticed[0].getMessage()
    assert " in step," in noticed[0].getMessage() and noticed[0].created < block_ended - 0.5


STALLED_ACTOR = """
import asyncio, logging, time
from turnstream.actors.environment import Environment, Reset, Step
from turnstream.actors.envs.guard.guarded import GuardedEnvironment
from turnstream.actors.envs.guard.hosts import LoopHost
from turnstream.actors.envs.guard.settings import GuardSettings
from turnstream.actors.envs.guard.timed import LoopBlockMeter
from turnstream.actors.envs.guard.watchdog import LoopWatchdog
from turnstream.actors.metrics import ActorMetrics

class Blocking(Environment):
    async def reset(self, seed):
        return Reset("go", "blocking")

    async def step(self, action):
        time.sleep(60)
        return Step("go", 0.0, done=True)

async def main():
    env = GuardedEnvironment(LoopHost(Blocking), GuardSettings("blocking", step_timeout_s=0.3),
                             LoopBlockMeter(0.02, LoopWatchdog(grace_s=0.3)), ActorMetrics())
    await env.reset(0)
    await env.step("x")

logging.basicConfig(level=logging.INFO)
asyncio.run(main())
print("the step returned")
"""


def test_an_actor_whose_loop_stays_blocked_exits_non_zero_for_its_supervisor_to_restart_it():
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", STALLED_ACTOR], capture_output=True, text=True, cwd=ROOT,
                          timeout=60)
    assert done.returncode == LOOP_STALL_EXIT_STATUS, done.stderr
    assert time.monotonic() - started < 30  # long before the 60 s block ends
    assert "the step returned" not in done.stdout
    assert "environment blocking has held the actor's event loop" in done.stderr
    assert f"the actor exits with status {LOOP_STALL_EXIT_STATUS}: environment blocking" in done.stderr
    assert "in step, past its 0.3s limit" in done.stderr


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


async def test_a_worker_killed_for_a_stuck_call_takes_the_processes_its_environment_started():
    metrics = ActorMetrics()
    pool = await WorkerPool.start(GuardSettings("probe_child", workers=1), metrics)
    try:
        (worker,) = pool.workers
        worker_pid = worker.pid
        worker, ep, _ = await pool.open("probe_child", {"block_s": 3600.0})
        reset = await pool.call(worker, ep, "reset", seed=0, task=None)
        child = int(reset["reset"]["observation"].split()[1])
        assert _alive(child) and os.getpgid(worker_pid) == worker_pid  # the worker leads its own group
        try:
            async with asyncio.timeout(0.3):  # the step's limit: the call is cancelled, and stays stuck
                await pool.call(worker, ep, "step", action="hi")
        except TimeoutError:
            pass
        await pool.close_episode(worker, ep)  # as the guard does: the stuck worker's last episode is over
        for _ in range(200):
            if not _alive(worker_pid) and not _alive(child):
                break
            await asyncio.sleep(0.05)
        assert not _alive(worker_pid), "the worker with a stuck call was not killed"
        assert not _alive(child), "a process its environment started outlived the killed worker"
    finally:
        await pool.close()
