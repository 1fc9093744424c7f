"""An episode that ends before streaming a chunk keeps its credit for the next episode (real BufferLink and
ZeroMQ sockets on 127.0.0.1; the buffer side is a ROUTER that grants credits once)."""
from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio

from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.envs.registry import make_env
from turnstream.actors.tasks.orders import RandomOrder
from turnstream.actors.tasks.source import TaskSource
from turnstream.actors.inference.client import InferenceError
from turnstream.actors.link import BufferLink
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.context import Sampling
from turnstream.actors.play.env_loop import EnvironmentLoop
from turnstream.actors.play.runner import EpisodeRunner
from turnstream.protocol.codec import decode, encode
from turnstream.protocol.messages import CreditGrant, CreditRequest
from tests.helpers import link_to_router


class FailingClient:
    def __init__(self):
        self.calls = 0

    async def generate(self, token_ids, **kw):
        self.calls += 1
        await asyncio.sleep(0)
        raise InferenceError("no vLLM server could serve the request")


async def _serve_grants(router, credits: int, server_id: str) -> None:
    """Answer the first credit request with `credits`, every later one with none (heartbeats)."""
    granted = False
    while True:
        identity, *frames = await router.recv_multipart()
        if isinstance(decode(frames), CreditRequest):
            grant = CreditGrant(credits=0 if granted else credits, learner_version=0, server_id=server_id)
            granted = True
            await router.send_multipart([identity, *encode(grant)])


async def test_failed_first_turns_do_not_leak_credits(tiny_model):
    ctx = zmq.asyncio.Context()
    router, link, metrics = link_to_router(ctx, "actor-c", slots=2, heartbeat_s=0.2)
    client = FailingClient()
    runner = EpisodeRunner(actor_id="actor-c", epoch=1, player=EnvironmentLoop(lambda: make_env("trivial")),
                           chat=ChatTokens(tiny_model), client=client, link=link,
                           sampling=Sampling(1.0, 8, 512), metrics=metrics, tasks=TaskSource(RandomOrder(0)))
    tasks = [asyncio.create_task(c) for c in (_serve_grants(router, 2, "buffer-1"), link.run(), runner.run(2))]
    try:
        deadline = asyncio.get_running_loop().time() + 30.0  # returns as soon as 50 episodes were tried
        while client.calls < 50 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        # two credits were granted, ever: every later episode ran on a credit given back
        assert client.calls >= 50
        assert metrics.episodes.labels("abandoned")._value.get() >= 48
        assert link.credits <= 2
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        ctx.destroy(linger=0)


async def test_a_credit_from_a_restarted_buffer_is_not_given_back():
    link = BufferLink(zmq.asyncio.Context.instance(), "tcp://127.0.0.1:9", actor_id="actor-r", epoch=1, slots=1,
                      max_unacked=10, resend_after_s=60.0, metrics=ActorMetrics(), max_message_bytes=1 << 20)
    link.server_id, link.credits = "buffer-1", 1
    granted_by = await link.acquire_credit()
    link.server_id = "buffer-2"  # the buffer restarted while the episode ran: its credits died with it
    await link.return_credit(granted_by)
    assert link.credits == 0
    link.sock.close(linger=0)
