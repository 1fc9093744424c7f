"""The buffer's answers to an actor's chunks: delayed, grouped acks.

The acks of the chunks applied within `delay_s` of the first one leave together, as TCP delays its acks and
a Kafka producer lingers: one log commit and one message per actor then answer the group, and the actor's
link wakes once for it instead of once per chunk; the delay (1 ms by default) is nothing next to a turn's
generation time. A group of ACK_AFTER_CHUNKS is sent without waiting out the delay, so an actor whose
window is larger never stalls on it.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from turnstream.protocol.codec import encode
from turnstream.protocol.messages import AckBatch

log = logging.getLogger("turnstream.buffer")

ACK_AFTER_CHUNKS = 16
ACK_CODES = {status: i for i, status in enumerate(AckBatch.STATUSES)}

AckEntry = tuple[int, str, str]  # (seq, status, reason) of one chunk


class AckGroup:
    """Acks not yet sent, per actor identity, in the order their chunks were applied."""

    def __init__(self, delay_s: float):
        self.delay_s = delay_s
        self.by_actor: dict[bytes, list[AckEntry]] = {}
        self.chunks = 0
        self.due_at = 0.0

    def add(self, identity: bytes, entries: list[AckEntry]) -> None:
        if not entries:
            return
        if self.chunks == 0:
            self.due_at = time.monotonic() + self.delay_s
        self.by_actor.setdefault(identity, []).extend(entries)
        self.chunks += len(entries)

    def wait_s(self) -> float | None:
        """How long more chunks may still join the group; None when it is empty (nothing to wait for)."""
        return None if self.chunks == 0 else self.due_at - time.monotonic()

    def due(self) -> bool:
        return self.chunks >= ACK_AFTER_CHUNKS or (self.chunks > 0 and time.monotonic() >= self.due_at)

    def take_replies(self) -> list[list]:
        """One ack message per actor, as [identity, *frames]; the group is empty afterwards."""
        replies = []
        for identity, entries in self.by_actor.items():
            for seq, status, reason in entries:
                if reason:
                    log.warning("rejected chunk %d from %r: %s", seq, identity, reason)
            replies.append([identity, *encode(ack_reply(entries))])
        self.by_actor, self.chunks = {}, 0
        return replies


def ack_reply(entries: list[AckEntry]) -> AckBatch:
    """The one message that answers an actor's acks."""
    return AckBatch(seq=np.fromiter((e[0] for e in entries), np.int64, len(entries)),
                    status=np.fromiter((ACK_CODES[e[1]] for e in entries), np.uint8, len(entries)),
                    reasons=[e[2] for e in entries if e[1] == "rejected"])
