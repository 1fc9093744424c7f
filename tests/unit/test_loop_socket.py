"""LoopSocket over real ZeroMQ sockets on 127.0.0.1: no lost wake-up, waits at the HWM, stops watching the FD."""
from __future__ import annotations

import asyncio
import time

import pytest
import zmq
import zmq.asyncio

from turnstream.protocol.loop_socket import LoopSocket
from turnstream.launch.processes import free_port

pytestmark = pytest.mark.asyncio


@pytest.fixture
def ctx():
    """Destroyed even when a test fails: a context left to the garbage collector can hang it in zmq_ctx_term."""
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


def plain(ctx: zmq.asyncio.Context, kind: int) -> zmq.Socket:
    sock = ctx.socket(kind, socket_class=zmq.Socket)
    sock.setsockopt(zmq.LINGER, 0)
    return sock


async def test_both_directions_at_once_leave_no_message_unread(ctx):
    """Traffic both ways at once, each side sending while its reader waits: every message is read, in order."""
    router, dealer = plain(ctx, zmq.ROUTER), plain(ctx, zmq.DEALER)
    router.setsockopt(zmq.SNDHWM, 0)  # a ROUTER drops what meets a full pipe; here nothing may be dropped
    dealer.setsockopt(zmq.RCVHWM, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer.connect(f"tcp://127.0.0.1:{port}")
    a, b = LoopSocket(dealer), LoopSocket(router)
    n = 3000

    async def read(sock: LoopSocket, into: list) -> None:
        while len(into) < n:
            await sock.readable()
            while (frames := sock.recv_now()) is not None:
                into.append(frames)

    async def dealer_sends() -> None:
        for i in range(n):
            await a.send([b"d", str(i).encode()])
            if i % 64 == 0:
                await asyncio.sleep(0)

    at_router, at_dealer = [], []
    readers = [asyncio.create_task(read(b, at_router)), asyncio.create_task(read(a, at_dealer))]
    sender = asyncio.create_task(dealer_sends())
    await asyncio.wait_for(readers[0], 30)  # the router learns the dealer's identity from its messages
    identity = at_router[0][0].bytes
    for i in range(n):
        await b.send([identity, b"r", str(i).encode()])
        if i % 64 == 0:
            await asyncio.sleep(0)
    await asyncio.wait_for(readers[1], 30)
    await sender
    assert [int(f[2].bytes) for f in at_router] == list(range(n))
    assert [int(f[1].bytes) for f in at_dealer] == list(range(n))
    a.unwatch(), b.unwatch()


async def test_a_send_that_takes_the_fds_signal_still_wakes_the_reader(ctx):
    """libzmq's FD fires once per change of state, and a send processes pending commands, which takes that
    signal. A message that arrives just before a send must still wake the waiting reader."""
    router, dealer = plain(ctx, zmq.ROUTER), plain(ctx, zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{router.bind_to_random_port('tcp://127.0.0.1')}")
    link = LoopSocket(dealer)
    await link.send([b"hello"])
    assert router.poll(10_000)
    identity, _ = router.recv_multipart()
    for i in range(5):
        reader = asyncio.create_task(link.readable())
        await asyncio.sleep(0.05)  # the reader sleeps on the FD
        router.send_multipart([identity, b"%d" % i])
        time.sleep(0.2)  # blocks the loop: the message arrives and signals the FD before the loop looks
        assert link.send_now([b"ping"])  # processes the pending commands, consuming the signal
        await asyncio.wait_for(reader, 5)
        assert link.recv_now()[0].bytes == b"%d" % i
    link.unwatch()


def unheard_dealer(ctx: zmq.asyncio.Context, hwm: int) -> tuple[LoopSocket, int]:
    """A DEALER connected to a port where nobody listens yet: its messages queue in its pipe, up to hwm."""
    dealer = plain(ctx, zmq.DEALER)
    dealer.setsockopt(zmq.SNDHWM, hwm)
    port = free_port()
    dealer.connect(f"tcp://127.0.0.1:{port}")
    return LoopSocket(dealer), port


async def test_send_waits_at_the_high_water_mark_until_the_peer_drains(ctx):
    link, port = unheard_dealer(ctx, hwm=1)
    await link.send([b"first"])
    assert not link.send_now([b"second"]), "a full pipe must refuse the message, not drop it"
    waiting = asyncio.create_task(link.send([b"second"]))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    router = plain(ctx, zmq.ROUTER)
    router.bind(f"tcp://127.0.0.1:{port}")
    await asyncio.wait_for(waiting, 10)  # the peer arrived, the pipe drained, the send went through
    got = []
    while len(got) < 2:
        assert router.poll(10_000), "the router never got both messages"
        got.append(router.recv_multipart()[1])
    assert got == [b"first", b"second"]
    link.unwatch()


async def test_a_group_send_stops_at_the_high_water_mark_and_send_all_delivers_the_rest_in_order(ctx):
    link, port = unheard_dealer(ctx, hwm=2)
    messages = [[b"m", b"%d" % i] for i in range(6)]
    sent = link.send_many_now(messages)
    assert 0 < sent < len(messages), "the pipe holds only a few messages; the rest must be refused, not dropped"
    waiting = asyncio.create_task(link.send_all(messages[sent:]))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    router = plain(ctx, zmq.ROUTER)
    router.bind(f"tcp://127.0.0.1:{port}")
    await asyncio.wait_for(waiting, 10)
    got = []
    while len(got) < len(messages):
        assert router.poll(10_000), f"the router got {len(got)} of {len(messages)} messages"
        got.append(router.recv_multipart()[2])
    assert got == [b"%d" % i for i in range(6)]
    link.unwatch()


async def test_unwatch_stops_watching_and_a_later_wait_watches_again(ctx):
    router, dealer = plain(ctx, zmq.ROUTER), plain(ctx, zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{router.bind_to_random_port('tcp://127.0.0.1')}")
    link, loop = LoopSocket(dealer), asyncio.get_running_loop()
    await link.send([b"hello"])  # the first send starts watching the FD
    link.unwatch()
    assert not loop.remove_reader(dealer.get(zmq.FD)), "unwatch left the FD in the loop"
    assert router.poll(10_000)
    identity, _ = router.recv_multipart()
    router.send_multipart([identity, b"back"])
    await asyncio.wait_for(link.readable(), 10)
    assert link.recv_now()[0].bytes == b"back"
    link.unwatch()


async def test_readable_with_a_timeout_says_whether_a_message_came(ctx):
    """False once the time-out passes with nothing queued, True for a message that arrives meanwhile."""
    pull, push = plain(ctx, zmq.PULL), plain(ctx, zmq.PUSH)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push.connect(f"tcp://127.0.0.1:{port}")
    reader = LoopSocket(pull)
    try:
        assert await asyncio.wait_for(reader.readable(0.05), 10) is False
        assert await reader.readable(0) is False
        asyncio.get_running_loop().call_later(0.05, push.send, b"late")
        assert await asyncio.wait_for(reader.readable(60), 10) is True
        assert reader.recv_now()[0].bytes == b"late"
    finally:
        reader.unwatch()
