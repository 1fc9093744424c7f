"""SPO's curriculum in the actor (`tasks.order = "spo"`, drawn by tasks/orders.py's SpoOrder): the weight
rule, and the learner's tracker values it reads.

Task x is drawn with probability proportional to sqrt(v(1 - v)) + epsilon, v being the learner's SPO tracker
value of x's prompt (its Beta posterior mean of success): a task the policy solves about half the time weighs
most, solved and hopeless ones keep the floor epsilon (docs/estimators.md, "SPO's curriculum").

The values reach the actor with the learner's version announcements (protocol `version`: the prompts each
step folded in). They are as stale as the announcements, which is fine for a sampling weight; a task whose
prompt has no value yet (never played, or its value not announced since this actor subscribed) weighs as the
tracker's prior v = 0.5, the most, so unseen tasks are tried first.

The order learns which prompt keys a task produces from the episodes it hands out (`played`), since an
environment names its tasks by index and the tracker names them by prompt key; a multi-agent task has one
key per agent, and weighs by the mean of their values.
"""
from __future__ import annotations

import logging
import math

from turnstream.protocol.codec import DecodeError, decode
from turnstream.protocol.messages import VersionAnnouncement

log = logging.getLogger("turnstream.actor.curriculum")

PRIOR_VALUE = 0.5  # the tracker's value of a prompt it has no evidence on (Jeffreys prior)


def spo_weight(v: float, epsilon: float) -> float:
    return math.sqrt(max(v * (1.0 - v), 0.0)) + epsilon


class TrackerValues:
    """The latest announced tracker value per prompt key."""

    def __init__(self):
        self.values: dict[str, float] = {}
        self.changes = 0  # bumped on every applied announcement, so that orders know to re-weigh

    def apply(self, msg: VersionAnnouncement) -> bool:
        """Fold an announcement's values in; False (nothing applied) for malformed lists."""
        if len(msg.prompt_keys) != len(msg.prompt_values) or not all(0.0 <= v <= 1.0 for v in msg.prompt_values):
            return False
        if msg.prompt_keys:
            self.values.update(zip(msg.prompt_keys, msg.prompt_values))
            self.changes += 1
        return True


async def follow_announcements(sub, values: TrackerValues, metrics, max_bytes: int) -> None:
    """Apply every version announcement on the learner's PUB socket `sub` to `values`, for ever."""
    while True:
        frames = await sub.recv_multipart(copy=False)
        try:
            msg = decode(frames, max_bytes)
        except DecodeError as exc:
            metrics.bad_messages.labels(exc.reason).inc()
            continue
        if not isinstance(msg, VersionAnnouncement):
            continue
        if not values.apply(msg):
            metrics.bad_messages.labels("bad_values").inc()
            log.warning("version %d announced %d prompt keys with %d values (or values outside [0, 1]); ignored",
                        msg.version, len(msg.prompt_keys), len(msg.prompt_values))
            continue
        metrics.tracker_values.set(len(values.values))
