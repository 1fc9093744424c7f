"""The HTTP environment adapter against the reference server: normal play, slow, failing, malformed, dying."""
from __future__ import annotations

import asyncio
import sys
import time
import urllib.request

import pytest
from aiohttp import web

from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.environment import EnvError
from turnstream.actors.envs.registry import make_env
from turnstream.actors.tasks.orders import RandomOrder
from turnstream.actors.tasks.source import TaskSource
from turnstream.actors.envs.remote.http_env import close_sessions
from turnstream.actors.envs.remote.http_server import make_app
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.context import Sampling
from turnstream.actors.play.env_loop import EnvironmentLoop
from turnstream.actors.play.runner import EpisodeRunner
from tests.unit.fakes import CollectingLink, ScriptedClient, streams
from turnstream.launch.processes import ProcessGroup, free_port


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
async def server(request):
    kwargs = getattr(request, "param", {})
    runner, url = await _serve(make_app(**kwargs))
    yield url
    await close_sessions()
    await runner.cleanup()


def _runner(tiny_model, factory, link, metrics):
    return EpisodeRunner(actor_id="a", epoch=1, player=EnvironmentLoop(factory), chat=ChatTokens(tiny_model),
                         client=ScriptedClient(), link=link, sampling=Sampling(1.0, 16, 512),
                         metrics=metrics, tasks=TaskSource(RandomOrder(0)))


async def test_remote_sokoban_plays_like_the_local_one(server):
    remote = make_env("http", url=server, name="sokoban", args={"max_steps": 5})
    local = make_env("sokoban", max_steps=5)
    r1, r2 = await remote.reset(11), await local.reset(11)
    assert (r1.observation, r1.prompt_key) == (r2.observation, r2.prompt_key)
    assert remote.action_tokens == ["U", "D", "L", "R"] and remote.max_action_tokens == 1
    for move in "UDLRU":
        s1, s2 = await remote.step(move), await local.step(move)
        assert (s1.observation, s1.reward, s1.done, s1.truncated) == (s2.observation, s2.reward, s2.done,
                                                                      s2.truncated)
    await remote.close()


async def test_remote_two_player_game_through_the_runner(server, tiny_model):
    link, metrics = CollectingLink(), ActorMetrics()
    runner = _runner(tiny_model, lambda: make_env("http", url=server, name="tictactoe"), link, metrics)
    outcomes = [await runner.play(f"e{i}", seed=i) for i in range(5)]
    assert set(outcomes) <= {"success", "done"}
    assert {c.agent_id for c in link.chunks} == {0, 1}
    assert all(s[-1].done for s in streams(link.chunks).values())


async def test_create_with_bad_arguments_is_an_http_400(server):
    env = make_env("http", url=server, name="sokoban", args={"bogus": 1})
    with pytest.raises(EnvError) as info:
        await env.reset(0)
    assert info.value.kind == "http_400"


@pytest.mark.parametrize("server", [{"delay_s": 1.0}], indirect=True)
async def test_slow_server_times_out(server):
    env = make_env("http", url=server, name="follow_signs", timeout_s=0.2)
    with pytest.raises(EnvError) as info:
        await env.reset(0)
    assert info.value.kind == "timeout"
    slow_but_patient = make_env("http", url=server, name="follow_signs", timeout_s=5.0)
    assert (await slow_but_patient.reset(0)).observation.startswith("junction")


@pytest.mark.parametrize("server", [{"fail_every": 3}], indirect=True)
async def test_failing_server_abandons_episodes_and_the_actor_keeps_going(server, tiny_model):
    link, metrics = CollectingLink(), ActorMetrics()
    runner = _runner(tiny_model, lambda: make_env("http", url=server, name="follow_signs"), link, metrics)
    outcomes = [await runner.play(f"e{i}", seed=i) for i in range(10)]
    assert "env_error" in outcomes and ({"success", "done"} & set(outcomes))
    errors = metrics.registry.get_sample_value("turnstream_actor_env_errors_total", {"kind": "http_500"})
    assert errors == outcomes.count("env_error")


@pytest.mark.parametrize("reply", [
    lambda: web.Response(text="not json"),
    lambda: web.json_response(["a", "list"]),
    lambda: web.json_response({"observation": 5, "reward": 0.0, "done": False}),
    lambda: web.json_response({"observation": "x", "done": False}),
    lambda: web.json_response({"observation": "x", "reward": 0, "done": False, "rewards": {"zero": "one"}}),
])
async def test_malformed_step_replies_are_env_errors(reply):
    async def create(request):
        return web.json_response({"env_id": "e0"})

    async def reset(request):
        return web.json_response({"observation": "go", "prompt_key": "k"})

    async def step(request):
        return reply()

    app = web.Application()
    app.add_routes([web.post("/envs", create), web.post("/envs/{env_id}/reset", reset),
                    web.post("/envs/{env_id}/step", step)])
    runner, url = await _serve(app)
    try:
        env = make_env("http", url=url, name="anything")
        assert (await env.reset(0)).observation == "go"
        with pytest.raises(EnvError) as info:
            await env.step("L")
        assert info.value.kind == "malformed"
    finally:
        await close_sessions()
        await runner.cleanup()


async def test_server_dying_mid_episode_abandons_it_and_counts(tmp_path, tiny_model):
    """A real server process, stopped by PID after the first turn of the second episode."""
    procs = ProcessGroup(tmp_path)
    port = free_port()
    procs.start("envserver", [sys.executable, "-m", "turnstream.actors.envs.remote.http_server", "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=1).read()
            break
        except OSError:
            assert time.monotonic() < deadline, "env server did not start"
            await asyncio.sleep(0.1)

    class KillingClient(ScriptedClient):
        async def generate(self, token_ids, **kw):
            if len(self.calls) == 5:  # episode 2 (follow_signs with 2-4 turns) is under way
                await asyncio.to_thread(procs.stop_all)
            return await super().generate(token_ids, **kw)

    link, metrics = CollectingLink(), ActorMetrics()
    runner = EpisodeRunner(actor_id="a", epoch=1, player=EnvironmentLoop(lambda: make_env(
        "http", url=url, name="follow_signs", args={"junctions": [3]}, timeout_s=5.0)), chat=ChatTokens(tiny_model),
        client=KillingClient(), link=link, sampling=Sampling(1.0, 16, 512), metrics=metrics,
        tasks=TaskSource(RandomOrder(0)))
    try:
        outcomes = [await runner.play(f"e{i}", seed=i) for i in range(4)]
    finally:
        procs.stop_all()
        await close_sessions()
    assert outcomes[0] in {"success", "done"} and outcomes[1:] == ["env_error"] * 3
    assert metrics.registry.get_sample_value("turnstream_actor_env_errors_total", {"kind": "connection"}) == 3
    second = streams(link.chunks)["e1"]
    assert second and not any(c.done for c in second)  # the partial episode is left to expire in the buffer
