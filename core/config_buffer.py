"""The [buffer] table: admission, sampling, the rate limiter and the write-ahead log.

The group size of group sampling is the actors' (`tasks.group_size`, core/config_tasks.py); the rule that a
group fits in a batch spans both tables, so it is the Config's (core/config.py).

The rate limiter's deadlock rule reads buffer/store/ratelimit.py, so it runs in the pre-flight
(turnstream/checks/preflight.py), not here.
"""
from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from turnstream.core.config_fields import CpuIds, Port, Section
from turnstream.core.configtools import require


def episodes_of_batch(share: float, batch_episodes: int) -> int:
    """The whole episodes `share` of a batch of `batch_episodes` comes to (a share written as a decimal, 0.29 of
    100, counts as the 29 it means, not the 28 its float product rounds down to)."""
    return math.floor(share * batch_episodes + 1e-9)


def least_share(batch_episodes: int) -> float:
    """The smallest share, in four decimals, that comes to one episode of a batch."""
    return math.ceil(10_000 / batch_episodes) / 10_000


class PositiveReplaySection(Section):
    """Positive replay (EvoCUA): a success on a task the policy rarely solves is served again in later batches,
    within the staleness bound (buffer/store/positive_replay.py, docs/estimators.md "Positive replay")."""

    share: float = Field(0.0, ge=0, le=0.5, description="at most this share of a batch's episodes are replays of "
                         "kept successes; 0: off")
    hard_below: float = Field(0.25, gt=0, le=1, description="a task is hard while the share of its recent complete "
                              "episodes that succeeded is below this")
    success_return: float = Field(1.0, description="an episode succeeded when its return is at least this")
    window: int = Field(32, ge=1, description="complete episodes per task the pass rate counts (the newest ones)")
    max_replays: int = Field(2, ge=1, description="times a kept success is served again at most")


class CriticReplaySection(Section):
    """Off-policy critic data: whole episodes already trained, or dropped as stale, are served again to the critic
    alone, on top of the batch (buffer/store/critic_replay.py, docs/estimators.md "turn_td")."""

    share: float = Field(0.0, ge=0, le=4, description="episodes served to the critic alone per batch, as a share of "
                         "batch_episodes, on top of the batch; 0: off. Each costs the learner about what a fresh "
                         "episode does (BENCHMARKS.md, \"Off-policy turn critic\")")
    max_staleness: int = Field(16, ge=0, description="the critic's own bound: no critic-only episode older than "
                               "this many versions is served; >= buffer.max_staleness (the policy's) when on")
    capacity: int = Field(2048, ge=1, description="episodes the critic's pool holds at most (the oldest leave first)")


class BufferSection(Section):
    batch_episodes: int = Field(128, ge=1, description="B: episodes per learner batch")
    eta: int = Field(2, ge=0, description="AReaL off-policyness for admission; 0 = synchronous")
    max_staleness: int = Field(4, ge=0, description="hard bound: tokens older than this many versions never reach "
                               "the learner; >= eta")
    max_running: int = Field(512, ge=1, description="episodes in flight across all actors")
    max_items: int = Field(8192, ge=1, description="episodes held (running + ready); admission stops at this bound; "
                           ">= batch_episodes")
    episode_timeout_s: float = Field(300.0, gt=0, description="an episode without a chunk for this long is "
                                     "abandoned; the pre-flight refuses one a live episode can reach: each seat's "
                                     "turn, actor.request_timeout_s + env.step_timeout_s, times the seats")
    actor_timeout_s: float = Field(15.0, gt=0, description="an actor silent this long loses its unused credits")
    metrics_port: Port = Field(0, description="/metrics port; 0: the launcher picks one")
    sampling: Literal["fifo", "freshest", "group"] = Field(
        "fifo", description="which complete episodes make a batch: fifo (completion order), freshest (newest "
        "behaviour version first) or group (all tasks.group_size episodes of one prompt_key together, for group "
        "baselines)")
    group_timeout_s: float = Field(120.0, gt=0, description="a group still short of tasks.group_size this long "
                                   "after a member completed is dropped (counted as group_timeout)")
    drop_uniform_groups: bool = Field(False, description="sampling = group: drop a complete group whose members "
                                      "all got the same return (zero variance: no signal for a group baseline, "
                                      "DAPO's dynamic sampling), counted as uniform_group")
    segment_turns: int = Field(0, ge=0, description="learn from open episodes: serve an episode's next turns "
                               "before it ends once this many have arrived (plus the one that closes the segment: "
                               "the critic's value there bootstraps GAE; value-based estimators only). 0: whole "
                               "episodes only")
    segment_after_s: float = Field(0.0, ge=0, description="with segment_turns: also serve an open episode's next "
                                   "turns (at least one) once the oldest of them has waited this long; 0: never")
    samples_per_insert: float = Field(1.0, gt=0, description="Reverb-style rate limiter: samples per inserted "
                                      "episode; the slower side waits, nothing is dropped")
    min_size_to_sample: int = Field(1, ge=1, description="complete episodes held before the first batch is served")
    error_buffer: float = Field(0.0, ge=0,
                                description="half-width of the allowed samples-vs-inserts window; 0: no window")
    wal: bool = Field(True, description="write-ahead log of acked chunks (protocol/SCHEMA.md, \"Durability\")")
    wal_dir: str = Field("", description="empty: <run_dir>/buffer-wal")
    wal_fsync: Literal["always", "interval", "never"] = Field(
        "always", description="when an acked chunk reaches the disk")
    wal_fsync_interval_s: float = Field(0.05, gt=0, description="for wal_fsync = interval")
    wal_compact_bytes: int = Field(256 * 1024 * 1024, ge=1024 * 1024,
                                   description="rewrite the log without consumed data past this size (>= 1 MiB)")
    ack_delay_ms: float = Field(
        1.0, ge=0, le=1000, description="an ack (and the log commit before it) waits up to this long for more "
        "chunks, so that one ack message and one fsync answer several; 16 waiting chunks are acked at once. 0: every "
        "drained group is acked")
    positive_replay: PositiveReplaySection = Field(default_factory=PositiveReplaySection,
                                                   description="serve rare successes on hard tasks again")
    critic_replay: CriticReplaySection = Field(default_factory=CriticReplaySection,
                                               description="serve older episodes again to the critic alone")
    cpus: CpuIds = Field(default_factory=list, description="CPU ids this role is pinned to; empty: any")

    @model_validator(mode="after")
    def _cross_field_rules(self) -> BufferSection:
        require(self.max_staleness >= self.eta, "max_staleness",
                f"must be >= eta ({self.eta}), or admitted episodes would be dropped as stale")
        require(self.max_items >= self.batch_episodes, "max_items", "must be >= batch_episodes")
        require(self.segment_turns > 0 or self.segment_after_s == 0, "segment_after_s",
                "needs segment_turns > 0 (segments are off)")
        require(self.segment_turns == 0 or self.sampling != "group", "segment_turns",
                "segments are for value-based estimators; group sampling serves whole groups of episodes")
        replaying = self.positive_replay.share > 0
        require(not replaying or self.segment_turns == 0, "positive_replay.share",
                "replays whole episodes: needs segment_turns = 0")
        require(not replaying or self.sampling != "group", "positive_replay.share",
                "a replay would break a batch's whole groups: needs sampling other than group")
        b, positive, critic = self.batch_episodes, self.positive_replay.share, self.critic_replay.share
        require(positive == 0 or episodes_of_batch(positive, b) >= 1, "positive_replay.share",
                "must give a batch at least one replay (share * batch_episodes >= 1), or be 0 for off: with "
                f"batch_episodes ({b}) the least share is 1/{self.batch_episodes} ({least_share(b):g}), got {positive}")
        require(critic == 0 or episodes_of_batch(critic, b) >= 1, "critic_replay.share",
                "must give a batch at least one episode for the critic (share * batch_episodes >= 1), or be 0 "
                f"for off: with batch_episodes ({b}) the least share is 1/{self.batch_episodes} ({least_share(b):g}), "
                f"got {critic}")
        return self
