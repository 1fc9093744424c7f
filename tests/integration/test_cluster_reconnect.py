"""A ZeroMQ peer back from a partition is reached again within seconds (tests/cluster.py): a ROUTER on one
host, a DEALER asking it every 0.2 s from another, both with the options every role's sockets get
(protocol/sockets.py). The server's link is cut for longer than the heartbeat timeout, so the DEALER drops
the silent connection and connects again while the link is down. Without a connect timeout that connect()
waits on the kernel's SYN retransmissions (1, 3, 7, 15 s after its start), and the first answer after
the link's return comes up to as long again as the cut lasted. An HTTP request whose server's link goes
silent while it waits fails within seconds (protocol/http_links.py), not at its own, generous time limit.
Skipped, saying why, where network namespaces cannot be made."""
from __future__ import annotations

import sys
import textwrap
import time

import pytest

from tests.cluster import Cluster, cluster_unavailable
from tests.helpers import poll_until
from turnstream.launch.processes import ProcessGroup
from turnstream.protocol.http_links import SILENT_PEER_S
from turnstream.protocol.sockets import CONNECT_TIMEOUT_MS

pytestmark = pytest.mark.skipif(bool(reason := cluster_unavailable()), reason=reason or "")

ECHO = textwrap.dedent("""
    import sys, zmq
    from turnstream.protocol.sockets import configure
    sock = configure(zmq.Context().socket(zmq.ROUTER))
    sock.bind(f"tcp://{sys.argv[1]}:6000")
    while True:
        sock.send_multipart(sock.recv_multipart())
""")
# one line per answer: the wall-clock time it came
ASK = textwrap.dedent("""
    import sys, time, zmq
    from turnstream.protocol.sockets import configure
    sock = configure(zmq.Context().socket(zmq.DEALER))
    sock.connect(f"tcp://{sys.argv[1]}:6000")
    while True:
        sock.send(b"?")
        if sock.poll(200):
            while sock.poll(0):
                sock.recv()
            print(time.time(), flush=True)
""")
# The silent connection is dropped about 10 s into the cut (heartbeats), and the new connect's SYNs follow at
# about 10, 11, 13, 17 and 25 s: the link returns after the fourth, so without a connect timeout the first
# answer waits for the fifth, 5-7 s later.
CUT_S = 19


def answers_after(log, since: float) -> float | None:
    times = [float(line) for line in log.read_text().split()]
    return next((t for t in times if t > since), None)


def test_a_peer_back_from_a_partition_is_reached_again_within_seconds(tmp_path):
    with Cluster(["server", "client"]) as cluster:
        procs = ProcessGroup(tmp_path)
        try:
            address = cluster["server"].address
            procs.start("echo", cluster["server"].command([sys.executable, "-c", ECHO, address]))
            asker = procs.start("ask", cluster["client"].command([sys.executable, "-c", ASK, address]))
            poll_until(lambda: answers_after(asker.log_path, 0.0), "a first answer", 30)
            cluster.cut("server")
            time.sleep(CUT_S)
            cluster.restore("server")
            back = time.time()
            answered = poll_until(lambda: answers_after(asker.log_path, back), "an answer after the return", 30)
        finally:
            procs.stop_all()
    assert answered - back < CONNECT_TIMEOUT_MS / 1000 + 1.0  # a connect's wait, then one round trip


SLOW_SERVER = textwrap.dedent("""
    import asyncio, sys
    from aiohttp import web

    async def slow(request):
        print("asked", flush=True)
        await asyncio.sleep(600)
        return web.Response(text="late")

    async def health(request):
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/slow", slow)
    app.router.add_get("/health", health)
    web.run_app(app, host=sys.argv[1], port=8000, print=None, handle_signals=False)  # SIGTERM ends it at once
""")
# prints "asked" once its request is on its way, then the seconds until it failed
SLOW_REQUEST = textwrap.dedent("""
    import asyncio, sys, time
    import aiohttp
    from turnstream.protocol.http_links import silent_peer_connector

    async def main():
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(timeout=timeout, connector=silent_peer_connector()) as session:
            started = time.monotonic()
            try:
                async with session.post(f"http://{sys.argv[1]}:8000/slow", json={}) as resp:
                    await resp.text()
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                print("failed", time.monotonic() - started, repr(exc), flush=True)

    asyncio.run(main())
""")


def test_a_request_to_a_server_whose_link_goes_silent_fails_within_seconds(tmp_path):
    with Cluster(["server", "client"]) as cluster:
        procs = ProcessGroup(tmp_path)
        try:
            address = cluster["server"].address
            server = procs.start("slow", cluster["server"].command([sys.executable, "-c", SLOW_SERVER, address]))
            poll_until(lambda: cluster["client"].get(f"http://{address}:8000/health"), "the server", 30)
            client = procs.start("request", cluster["client"].command([sys.executable, "-c", SLOW_REQUEST, address]))
            poll_until(lambda: "asked" in server.log_path.read_text(), "the request at the server", 30)
            cluster.cut("server")  # the request waits for an answer that can no longer come
            failed = poll_until(lambda: [line for line in client.log_path.read_text().splitlines()
                                         if line.startswith("failed")], "the request to fail", 60)
        finally:
            procs.stop_all()
    assert float(failed[0].split()[1]) < SILENT_PEER_S + 5, failed
