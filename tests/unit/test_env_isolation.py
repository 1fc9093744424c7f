"""Environments in worker processes (env.isolation = "process"), with real workers: blocking code stalls no
other episode, a segfault or runaway memory costs only its worker's episodes (abandoned by reason, the worker
replaced), a call stuck in blocking code past its limit retires its worker, workers never outlive the actor, and
a worker never loads torch."""
from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from turnstream.actors.envs.guard.hosts import WorkerHost
from turnstream.actors.envs.guard.pool import WorkerPool
from turnstream.actors.envs.guard.settings import GuardSettings
from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.choose import player_for
from turnstream.actors.play.context import Sampling
from turnstream.actors.play.runner import EpisodeRunner
from turnstream.actors.tasks.orders import RandomOrder
from turnstream.actors.tasks.source import TaskSource
from tests.unit.fakes import CollectingLink, ScriptedClient

ROOT = Path(__file__).resolve().parents[2]


def _runner(tiny_model, name: str, args: dict, metrics: ActorMetrics, link=None, client=None,
            **guard) -> EpisodeRunner:
    player = player_for(name, args, GuardSettings(name, isolation="process", **guard))
    return EpisodeRunner(actor_id="a", epoch=1, player=player, chat=ChatTokens(tiny_model),
                         client=client or ScriptedClient(), link=link or CollectingLink(),
                         sampling=Sampling(1.0, 8, 512), metrics=metrics, tasks=TaskSource(RandomOrder(0)))


class SlowClient(ScriptedClient):
    """Generation takes `seconds`: episodes last long enough to be running when something else happens."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    async def generate(self, *args, **kwargs):
        await asyncio.sleep(self.seconds)
        return await super().generate(*args, **kwargs)


async def _play(runner: EpisodeRunner, seeds) -> list[str]:
    return list(await asyncio.gather(*(runner.play(f"e{s}", seed=s) for s in seeds)))


def _count(metrics: ActorMetrics, name: str, **labels) -> float:
    return metrics.registry.get_sample_value(name, labels or None) or 0.0


def _pools(runner: EpisodeRunner) -> list[WorkerPool]:
    from turnstream.actors.envs.guard.hosts import _POOLS

    host = runner.player.host
    assert isinstance(host, WorkerHost)
    return [p for objects in _POOLS._objects.values() for k, p in objects.items() if k is host]


def _draws(seed: int, n: int, every: int) -> list[int]:
    """probe_hang's first `n` draws for `seed` (0: that step hangs)."""
    rng = random.Random(seed)
    return [rng.randrange(every) for _ in range(n)]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


async def test_a_blocking_environment_stalls_no_other_episode_and_its_attributes_cross(tiny_model):
    metrics = ActorMetrics()
    runner = _runner(tiny_model, "probe_block", {"block_s": 0.3, "turns": 2}, metrics, workers=2)
    await _play(runner, range(2))  # the workers are up
    gaps: list[float] = []

    async def heartbeat():
        while True:
            before = time.monotonic()
            await asyncio.sleep(0.01)
            gaps.append(time.monotonic() - before)

    beating = asyncio.ensure_future(heartbeat())
    started = time.monotonic()
    outcomes = await _play(runner, range(8))
    took = time.monotonic() - started
    beating.cancel()
    assert outcomes == ["done"] * 8
    # on the actor's loop the 16 steps would take 4.8 s, the loop held 0.3 s at a time
    assert took < 3.0 and max(gaps) < 0.2, (took, max(gaps))
    assert _count(metrics, "turnstream_actor_env_loop_blocks_total", env="probe_block") == 0

    link = CollectingLink()
    odds = _runner(tiny_model, "fixed_odds", {}, metrics, link=link)
    assert await odds.play("o", seed=0, task=2) in ("success", "done")
    assert [len(c.allowed_tokens) for c in link.chunks] == [2], "action_tokens came from the worker's environment"
    assert await odds.play("bad", seed=0, task=99) == "env_error"  # its ValueError, counted as an exception
    assert _count(metrics, "turnstream_actor_env_errors_total", kind="exception") == 1


async def test_a_segfault_costs_only_its_workers_episodes_and_the_worker_is_replaced(tiny_model):
    metrics = ActorMetrics()
    doomed = [s for s in range(200) if random.Random(s).randrange(50) == 0][0]
    spared = [s for s in range(200) if random.Random(s).randrange(50) != 0][:7]
    runner = _runner(tiny_model, "probe_crash", {"every": 50, "how": "segfault", "turns": 3}, metrics, workers=2)
    outcomes = await _play(runner, [doomed, *spared])
    lost = outcomes.count("env_error")
    assert outcomes[0] == "env_error" and 1 <= lost <= 5 and outcomes.count("done") == 8 - lost, outcomes
    assert _count(metrics, "turnstream_actor_env_errors_total", kind="worker_died") == lost
    assert _count(metrics, "turnstream_actor_env_worker_restarts_total", reason="died") == 1
    for _ in range(200):  # the replacement starts
        if len([w for w in _pools(runner)[0].workers if w.ready]) == 2:
            break
        await asyncio.sleep(0.05)
    assert len([w for w in _pools(runner)[0].workers if w.ready]) == 2
    assert await _play(runner, spared) == ["done"] * 7


async def test_a_worker_over_its_memory_limit_is_killed_and_replaced(tiny_model):
    metrics = ActorMetrics()
    runner = _runner(tiny_model, "probe_memory", {"mb_per_step": 32, "turns": 100}, metrics, workers=1,
                     worker_memory_mb=160)
    assert await _play(runner, range(2)) == ["env_error"] * 2
    assert _count(metrics, "turnstream_actor_env_errors_total", kind="worker_memory") == 2
    assert _count(metrics, "turnstream_actor_env_worker_restarts_total", reason="memory") == 1


async def test_a_call_stuck_in_blocking_code_retires_its_worker_without_cutting_its_other_episodes(tiny_model,
                                                                                                   caplog):
    metrics = ActorMetrics()
    hangs = next(s for s in range(100) if _draws(s, 1, 8) == [0])  # its first step hangs
    calm = next(s for s in range(100) if 0 not in _draws(s, 8, 8))  # none of its eight steps does
    args = {"every": 8, "hang_s": 60.0, "blocking": True, "turns": 8}
    # one worker; the calm episode (8 turns of 0.5 s) still runs when the stuck one (0.5 s, its 0.5 s limit,
    # the 2 s grace of its cancel) retires their worker
    runner = _runner(tiny_model, "probe_hang", args, metrics, client=SlowClient(0.5), workers=1, step_timeout_s=0.5)
    assert await _play(runner, [hangs, calm]) == ["env_error", "done"]
    assert _count(metrics, "turnstream_actor_env_errors_total", kind="timeout") == 1
    retired = re.search(r"environment worker (\d+): a call past its time limit is stuck.* its other 1 have",
                        caplog.text)
    assert retired, caplog.text
    for _ in range(100):  # killed, since its other episode has finished, and counted
        if _count(metrics, "turnstream_actor_env_worker_restarts_total", reason="hung"):
            break
        await asyncio.sleep(0.05)
    assert not _alive(int(retired.group(1)))
    assert _count(metrics, "turnstream_actor_env_worker_restarts_total", reason="hung") == 1
    (replacement,) = _pools(runner)[0].workers  # started when the other was retired
    for _ in range(400):
        if replacement.serving():
            break
        await asyncio.sleep(0.05)
    assert replacement.serving() and replacement.pid != int(retired.group(1))


async def test_a_cancellable_hang_times_out_without_replacing_its_worker(tiny_model):
    metrics = ActorMetrics()
    hangs = next(s for s in range(100) if _draws(s, 1, 2) == [0])
    runner = _runner(tiny_model, "probe_hang", {"every": 2, "hang_s": 60.0, "turns": 1}, metrics, workers=1,
                     step_timeout_s=0.3)
    assert await _play(runner, [hangs]) == ["env_error"]
    assert _count(metrics, "turnstream_actor_env_errors_total", kind="timeout") == 1
    assert sum(_count(metrics, "turnstream_actor_env_worker_restarts_total", reason=r) for r in
               ("died", "memory", "hung")) == 0


async def test_a_worker_loads_no_torch_and_goes_when_the_pool_closes(tiny_model):
    metrics = ActorMetrics()
    pool = await WorkerPool.start(GuardSettings("probe_block", workers=2), metrics)
    pids = [w.pid for w in pool.workers]
    worker, ep, _ = await pool.open("probe_block", {"block_s": 0.0})
    await pool.call(worker, ep, "reset", seed=0, task=None)
    await pool.call(worker, ep, "step", action="hi")
    maps = Path(f"/proc/{worker.pid}/maps").read_text()
    assert "torch" not in maps and "transformers" not in maps
    assert _count(metrics, "turnstream_actor_env_workers_alive") == 2
    await pool.close()
    assert not any(_alive(p) for p in pids)
    assert _count(metrics, "turnstream_actor_env_workers_alive") == 0


KILLED_ACTOR = """
import asyncio, sys
from turnstream.actors.envs.guard.pool import WorkerPool
from turnstream.actors.envs.guard.settings import GuardSettings
from turnstream.actors.metrics import ActorMetrics

async def main():
    pool = await WorkerPool.start(GuardSettings("probe_block", workers=2), ActorMetrics())
    print(" ".join(str(w.pid) for w in pool.workers), flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def test_workers_go_when_their_actor_is_killed():
    actor = subprocess.Popen([sys.executable, "-c", KILLED_ACTOR], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        pids = [int(p) for p in actor.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
    finally:
        os.kill(actor.pid, signal.SIGKILL)
        actor.wait(10)
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids), "a worker outlived its SIGKILLed actor"
