"""The environment guard on the actor's loop: time limits on reset, step and close (the run's, or the
environment's own, which win), loop-block detection naming the environment, the [env] settings, and the
misbehaving probes being deterministic from the reset seed."""
from __future__ import annotations

import asyncio
import logging
import time

import pytest

from turnstream.actors.environment import Environment, Reset, Step
from turnstream.actors.envs.guard.settings import GuardSettings, auto_workers
from turnstream.actors.envs.guard.timed import Timed
from turnstream.actors.envs.probes.misbehaving import Crash, Hang, SlowTool
from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.choose import player_for
from turnstream.actors.play.context import Sampling
from turnstream.actors.play.env_loop import EnvironmentLoop
from turnstream.actors.play.runner import EpisodeRunner
from turnstream.actors.tasks.orders import RandomOrder
from turnstream.actors.tasks.source import TaskSource
from turnstream.core.config import ConfigError, load_config
from tests.unit.fakes import CollectingLink, ScriptedClient


def _runner(tiny_model, player, metrics: ActorMetrics) -> EpisodeRunner:
    return EpisodeRunner(actor_id="a", epoch=1, player=player, chat=ChatTokens(tiny_model), client=ScriptedClient(),
                         link=CollectingLink(), sampling=Sampling(1.0, 8, 512), metrics=metrics,
                         tasks=TaskSource(RandomOrder(0)))


def _count(metrics: ActorMetrics, name: str, **labels) -> float:
    return metrics.registry.get_sample_value(name, labels or None) or 0.0


class Stalling(Environment):
    """Awaits `stall_s` in the call named `stalls`; two turns otherwise."""

    def __init__(self, stalls: str, stall_s: float = 30.0, **own_limits):
        self.stalls, self.stall_s, self.turn = stalls, stall_s, 0
        for name, value in own_limits.items():  # the environment's own time limits
            setattr(self, name, value)

    async def _maybe_stall(self, call: str) -> None:
        if call == self.stalls:
            await asyncio.sleep(self.stall_s)

    async def reset(self, seed: int) -> Reset:
        await self._maybe_stall("reset")
        self.turn = 0
        return Reset("go", "stall")

    async def step(self, action: str) -> Step:
        await self._maybe_stall("step")
        self.turn += 1
        return Step("go", 0.0, done=self.turn >= 2)

    async def close(self) -> None:
        await self._maybe_stall("close")


FAST = GuardSettings("stalling", reset_timeout_s=0.2, step_timeout_s=0.2, close_timeout_s=0.2)


@pytest.mark.parametrize("call", ["reset", "step"])
async def test_a_hanging_call_abandons_the_episode_as_timeout_and_frees_the_slot(tiny_model, call):
    metrics = ActorMetrics()
    runner = _runner(tiny_model, EnvironmentLoop(lambda: Stalling(call), FAST), metrics)
    started = time.monotonic()
    assert await runner.play("e0", seed=0) == "env_error"
    assert time.monotonic() - started < 5
    assert _count(metrics, "turnstream_actor_env_errors_total", kind="timeout") == 1
    # the slot goes on: the next episode of a well-behaved environment plays through
    well = _runner(tiny_model, EnvironmentLoop(lambda: Stalling("never"), FAST), metrics)
    assert await well.play("e1", seed=1) == "done"


async def test_a_hanging_close_is_counted_and_never_fails_the_slot(tiny_model, caplog):
    metrics = ActorMetrics()
    runner = _runner(tiny_model, EnvironmentLoop(lambda: Stalling("close"), FAST), metrics)
    with caplog.at_level(logging.WARNING, "turnstream.actor"):
        assert await runner.play("e0", seed=0) == "done"
    assert _count(metrics, "turnstream_actor_env_close_failures_total", kind="timeout") == 1
    assert _count(metrics, "turnstream_actor_env_errors_total", kind="timeout") == 0
    assert "close failed (timeout)" in caplog.text


async def test_the_environments_own_limits_win_over_the_runs(tiny_model):
    metrics = ActorMetrics()
    generous_run = GuardSettings("stalling", step_timeout_s=30.0)
    strict_env = EnvironmentLoop(lambda: Stalling("step", 5.0, step_timeout_s=0.1), generous_run)
    assert await _runner(tiny_model, strict_env, metrics).play("e0", seed=0) == "env_error"
    assert _count(metrics, "turnstream_actor_env_errors_total", kind="timeout") == 1
    strict_run = GuardSettings("stalling", step_timeout_s=0.05)
    patient_env = EnvironmentLoop(lambda: Stalling("step", 0.2, step_timeout_s=5.0), strict_run)
    assert await _runner(tiny_model, patient_env, metrics).play("e1", seed=1) == "done"


async def test_an_environments_own_timeout_error_is_not_taken_for_the_limit(tiny_model):
    class Raising(Stalling):
        async def step(self, action: str) -> Step:
            raise TimeoutError("its tool timed out")

    metrics = ActorMetrics()
    runner = _runner(tiny_model, EnvironmentLoop(lambda: Raising("never"), FAST), metrics)
    assert await runner.play("e0", seed=0) == "env_error"
    assert _count(metrics, "turnstream_actor_env_errors_total", kind="exception") == 1
    assert _count(metrics, "turnstream_actor_env_errors_total", kind="timeout") == 0


async def test_a_blocking_environment_is_named_in_the_loop_block_counters_and_the_log(tiny_model, caplog):
    metrics = ActorMetrics()
    guard = GuardSettings("probe_block", loop_block_warn_s=0.02)
    with caplog.at_level(logging.WARNING, "turnstream.actor"):
        blocking = _runner(tiny_model, player_for("probe_block", {"block_s": 0.05, "turns": 3}, guard), metrics)
        assert await blocking.play("e0", seed=0) == "done"
        well = _runner(tiny_model, player_for("trivial", {"turns": 3}, GuardSettings("trivial")), metrics)
        assert await well.play("e1", seed=1) == "done"
    assert _count(metrics, "turnstream_actor_env_loop_blocks_total", env="probe_block") == 3
    assert _count(metrics, "turnstream_actor_env_loop_blocked_seconds_total", env="probe_block") >= 0.15
    assert _count(metrics, "turnstream_actor_env_loop_blocks_total", env="trivial") == 0
    lines = [r.getMessage() for r in caplog.records if "held the actor's event loop" in r.getMessage()]
    assert len(lines) == 1, "rate-limited: one line per environment per 30 s"
    assert "probe_block" in lines[0] and 'env.isolation = "process"' in lines[0]


async def test_timed_passes_results_errors_and_cancellation_through_unchanged():
    held: list[float] = []

    async def blocks_then_returns() -> int:
        time.sleep(0.03)
        await asyncio.sleep(0)
        return 7

    assert await Timed(blocks_then_returns(), 0.02, held.append) == 7
    assert len(held) == 1 and held[0] >= 0.03

    async def fails():
        await asyncio.sleep(0)
        raise KeyError("x")

    with pytest.raises(KeyError):
        await Timed(fails(), 0.02, held.append)

    cleaned = asyncio.Event()

    async def waits_forever():
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.set()

    task = asyncio.ensure_future(Timed(waits_forever(), 0.02, held.append))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned.is_set() and len(held) == 1


def test_the_env_settings_are_validated_and_name_the_setting():
    cfg = load_config(None, ['env.isolation="process"', "env.workers=3", "env.worker_memory_mb=512",
                             "env.step_timeout_s=2.5"])
    guard = GuardSettings.from_config(cfg.env)
    assert (guard.isolation, guard.worker_count(), guard.worker_memory_mb, guard.step_timeout_s) == \
        ("process", 3, 512, 2.5)
    assert 2 <= GuardSettings().worker_count() == auto_workers() <= 4
    for bad, setting in [("env.step_timeout_s=0", "env.step_timeout_s"), ("env.reset_timeout_s=-1",
                         "env.reset_timeout_s"), ("env.close_timeout_s=0", "env.close_timeout_s"),
                         ('env.isolation="thread"', "env.isolation"), ("env.workers=-1", "env.workers")]:
        with pytest.raises(ConfigError, match=setting.replace(".", r"\.")):
            load_config(None, [bad])


async def test_the_misbehaving_probes_misbehave_the_same_way_for_the_same_seed():
    async def fates(make, seeds) -> list:
        out = []
        for seed in seeds:
            env = make()
            await env.reset(seed)
            out.append(env.doomed if isinstance(env, Crash) else [env.rng.random() for _ in range(3)])
        return out

    seeds = range(40)
    assert await fates(lambda: Crash(every=5), seeds) == await fates(lambda: Crash(every=5), seeds)
    assert 0 < sum(await fates(lambda: Crash(every=5), seeds)) < 40
    assert await fates(lambda: SlowTool(), seeds) == await fates(lambda: SlowTool(), seeds)
    hang = Hang(every=1, hang_s=0.05, turns=2)
    await hang.reset(0)
    started = time.monotonic()
    assert (await hang.step("x")).done is False
    assert time.monotonic() - started >= 0.05


def test_what_crosses_to_a_worker_keeps_its_declared_types():
    import numpy as np

    from turnstream.actors.envs.guard.wire import HEADER, pack, step_to_wire, unpack

    step = Step("obs", np.float32(0.5), np.bool_(False), info={"n": np.int64(3), "seen": {1}, "obj": object()},
                agent=np.int64(1), rewards={np.int64(0): np.float64(-1.0)})
    frame = pack(step_to_wire(step))
    back = Step(**unpack(frame[HEADER.size:]))
    assert (back.reward, back.done, back.agent, back.rewards) == (0.5, False, 1, {0: -1.0})
    assert type(back.done) is bool and type(back.reward) is float
    assert back.info["n"] == 3 and back.info["seen"] == [1] and back.info["obj"].startswith("<object")
