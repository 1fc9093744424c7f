"""The learner's side of the buffer's serve socket."""
from __future__ import annotations

import itertools
import logging
import time
import uuid

import zmq

from turnstream.protocol.auth import make_client
from turnstream.protocol.codec import DecodeError, decode, encode
from turnstream.protocol.messages import Batch, BatchRequest
from turnstream.protocol.sockets import configure

log = logging.getLogger("turnstream.learner")


class BatchClient:
    """DEALER to the buffer's serve socket; re-asks after a timeout (the buffer keeps one request per peer).

    The routing id is fixed for the life of the process: after a reconnect (a stall past the heartbeat
    timeout drops the connection and any answer queued on it) the buffer still knows this learner, and
    answers the re-asked request id with the batch it already took for it instead of a fresh one.
    """

    def __init__(self, ctx, addr: str, max_message_bytes: int, curve=None):
        self.sock = configure(ctx.socket(zmq.DEALER), max_bytes=max_message_bytes)
        self.sock.setsockopt(zmq.ROUTING_ID, b"learner-" + uuid.uuid4().hex.encode())
        if curve is not None:  # protocol.auth.CurveKeys
            make_client(self.sock, curve)
        self.sock.connect(addr)
        self.max_message_bytes = max_message_bytes
        self.ids = itertools.count(1)

    async def get(self, version: int, episodes: int, max_tokens: int = 0, retry_s: float = 5.0,
                  poll_s: float = 0.0) -> Batch:
        """The next batch; with poll_s > 0 the buffer answers an empty batch of status "timeout" after that long
        without data (keep poll_s below retry_s, or the re-ask replaces the request it would have answered)."""
        request_id = next(self.ids)
        while True:
            await self.sock.send_multipart(encode(BatchRequest(request_id, version, episodes, max_tokens, poll_s)))
            # wait out retry_s for our answer; a stray message (an earlier answer sent twice) is skipped
            deadline = time.monotonic() + retry_s
            while (left := deadline - time.monotonic()) > 0 and await self.sock.poll(left * 1000, zmq.POLLIN):
                frames = await self.sock.recv_multipart(copy=False)
                try:
                    msg = decode(frames, self.max_message_bytes)
                except DecodeError as exc:
                    log.error("undecodable batch: %s", exc)
                    continue
                if isinstance(msg, Batch) and msg.request_id == request_id:
                    return msg
