"""An agent on another host plays its episodes through the actor's OpenAI-compatible endpoint (tests/cluster.py):
the actor binds the endpoint on every interface of its host (actor.endpoint_bind_host = 0.0.0.0) on a fixed
port, and each episode's base URL names the actor host's own address (network.bind_host, as no
actor.endpoint_advertise_host is set). The agent function in the actor hands that base URL to a process on
the `agent` host, as a user's function hands it to a sandbox; that process makes the chat calls with the
openai client, across the bridge, and the reward it prints is the episode's. The turns reach the buffer on
its own host over CURVE. Generation is a stand-in vLLM on the actor host's loopback (tests/unit/fake_vllm.py):
what crosses hosts here is the endpoint, not the model. Skipped, saying why, where network namespaces cannot
be made."""
from __future__ import annotations

import asyncio
import os
import sys
import textwrap

import pytest

from tests.cluster import Cluster, cluster_unavailable
from tests.cluster_stack import ACTOR_METRICS, BUFFER_METRICS, VLLM_PORT, ClusterStack, metric_total
from tests.helpers import wait_for_child

pytestmark = pytest.mark.skipif(bool(reason := cluster_unavailable()), reason=reason or "")

ENDPOINT_PORT = 8100
AGENT_NAMESPACE = "TURNSTREAM_TEST_AGENT_NAMESPACE"  # the actor's environment: the namespace of the agent host

# The agent, run on its own host: two chat calls at the episode's base URL, then its reward.
REMOTE_AGENT = textwrap.dedent("""
    import sys
    import openai

    base_url, task = sys.argv[1], sys.argv[2]
    client = openai.OpenAI(base_url=base_url, api_key="turnstream", max_retries=0, timeout=30)
    messages = [{"role": "user", "content": f"Walk to {task}."}]
    for _ in range(2):
        reply = client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                     {"role": "user", "content": "And then?"}]
    print(1.0)
""")

FAKE_VLLM = textwrap.dedent("""
    import asyncio, sys
    from tests.unit.fake_vllm import FakeVllm

    async def serve():
        await FakeVllm("far", "0").start(int(sys.argv[1]))
        await asyncio.Event().wait()

    asyncio.run(serve())
""")


async def agent_on_another_host(client, task) -> float:
    """The user's agent function as the actor runs it: the episode is played on the agent host."""
    assert not client.base_url.host.startswith("127."), client.base_url  # an address the other host reaches
    proc = await asyncio.create_subprocess_exec(
        "ip", "netns", "exec", os.environ[AGENT_NAMESPACE], sys.executable, "-c", REMOTE_AGENT, str(client.base_url),
        task, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"the agent on its host failed: {err.decode()[-400:]}")
    return float(out.split()[-1])


def test_an_agent_on_another_host_plays_its_episodes_at_the_base_url_the_actor_advertises(tmp_path, tiny_model):
    with Cluster(["buffer", "actor0", "agent"]) as cluster:
        stack = ClusterStack(cluster, tmp_path, model=tiny_model)
        cfg = stack.cfg
        cfg.env.name = "agent"
        cfg.env.args = {"entry": "tests.integration.test_cluster_agent_endpoint:agent_on_another_host",
                        "tasks": ["north", "south"], "timeout_s": 60.0}
        cfg.actor.concurrent_episodes = 2
        cfg.actor.endpoint_bind_host, cfg.actor.endpoint_port = "0.0.0.0", ENDPOINT_PORT
        assert cfg.vllm.urls == [f"http://127.0.0.1:{VLLM_PORT}"]  # no vllm host: the actor host's loopback
        try:
            stack.procs.start("fake-vllm", cluster["actor0"].command([sys.executable, "-c", FAKE_VLLM,
                                                                      str(VLLM_PORT)]))
            stack.start_role("buffer")
            actor = stack.start_actor(0, env={AGENT_NAMESPACE: cluster["agent"].namespace})
            actor_metrics = stack.url("actor0", ACTOR_METRICS)

            def finished() -> str:
                metrics = cluster["agent"].get(actor_metrics)
                success = metric_total(metrics, 'turnstream_actor_episodes_total{outcome="success"}')
                return metrics if success >= 2 else ""

            metrics = wait_for_child(finished, "two episodes played by the agent on its host", actor, timeout_s=180)
            buffer = cluster["agent"].get(stack.url("buffer", BUFFER_METRICS))
            log = actor.log_path.read_text()
        finally:
            stack.procs.stop_all()
    address = cluster["actor0"].address
    assert f"base URLs http://{address}:{ENDPOINT_PORT}/episodes/" in log
    assert metric_total(metrics, 'turnstream_actor_openai_requests_total{status="200"}') >= 4  # two calls an episode
    assert metric_total(metrics, "turnstream_actor_agent_errors_total{") == 0
    assert metric_total(buffer, 'turnstream_buffer_chunks_total{outcome="ok"}') >= 4  # the turns, on the buffer's host
