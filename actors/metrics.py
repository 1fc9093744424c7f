"""Prometheus metrics of an actor process."""
from __future__ import annotations

import logging
from typing import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary

from turnstream.core.build_info import register_build_info

log = logging.getLogger("turnstream.actor")

MAX_INFO_KEYS = 16  # keys are the environment's: a series each, so an actor keeps the first ones it meets
MAX_INFO_KEY_CHARS = 128  # longer label values read as ids to the metric lint (turnstream/reference/metrics.py)


class EpisodeInfoValues:
    """The figures of finished training episodes (the numbers of their last `Step.info`), a summary series per
    key: rate(_sum) / rate(_count) is a key's mean. The first `max_keys` keys an actor meets get a series; a
    figure of any other key, or of one longer than MAX_INFO_KEY_CHARS, is counted as dropped, with one warning."""

    def __init__(self, registry: CollectorRegistry, max_keys: int = MAX_INFO_KEYS):
        self.values = Summary("turnstream_actor_episode_info_values",
                              "Numbers the environment put in the last Step.info of each finished training "
                              "episode (not success, not bools), by info key: _sum / _count is the mean",
                              ["key"], registry=registry)
        self.dropped = Counter("turnstream_actor_episode_info_dropped_keys_total",
                               f"Episode info figures not observed: their key came after the first {max_keys} "
                               f"keys or is longer than {MAX_INFO_KEY_CHARS} characters", registry=registry)
        self.max_keys, self.keys, self.warned = max_keys, set[str](), False

    def observe(self, figures: Mapping[str, float]) -> None:
        """One finished episode's figures (play/episode_figures.py: EpisodeFigures.values)."""
        for key, value in figures.items():
            if key not in self.keys:
                if len(self.keys) >= self.max_keys or len(key) > MAX_INFO_KEY_CHARS:
                    self._drop(key)
                    continue
                self.keys.add(key)
            self.values.labels(key).observe(value)

    def _drop(self, key: str) -> None:
        self.dropped.inc()
        if not self.warned:
            self.warned = True
            log.warning("episode info key %r is not observed: an actor keeps the first %d keys of at most %d "
                        "characters (%s); further ones are counted in "
                        "turnstream_actor_episode_info_dropped_keys_total", key[:40], self.max_keys,
                        MAX_INFO_KEY_CHARS, ", ".join(sorted(self.keys)))


class ActorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        r = self.registry = registry or CollectorRegistry()
        register_build_info(r, "actor")
        self.episodes = Counter("turnstream_actor_episodes_total", "Episodes finished, by outcome",
                                ["outcome"], registry=r)
        self.episode_info = EpisodeInfoValues(r)
        self.turns = Counter("turnstream_actor_turns_total", "Turns played", registry=r)
        self.generated_tokens = Counter("turnstream_actor_generated_tokens_total", "Tokens sampled", registry=r)
        self.frozen_tokens = Counter("turnstream_actor_frozen_policy_tokens_total",
                                     "Tokens sampled by the fixed policy of actor.frozen_agents (never trained)",
                                     registry=r)
        self.chunks_sent = Counter("turnstream_actor_chunks_sent_total", "Turn chunks sent (first sends)",
                                   registry=r)
        self.resends = Counter("turnstream_actor_chunk_resends_total", "Chunks resent for lack of an ack",
                               registry=r)
        self.acks = Counter("turnstream_actor_acks_total", "Acks received, by status", ["status"], registry=r)
        self.bad_messages = Counter("turnstream_actor_bad_messages_total", "Undecodable messages, by reason",
                                    ["reason"], registry=r)
        self.inference_errors = Counter("turnstream_actor_inference_errors_total", "Failed generate calls",
                                        registry=r)
        self.env_errors = Counter("turnstream_actor_env_errors_total",
                                  "Episodes abandoned because the environment failed, by kind", ["kind"], registry=r)
        # the environment guard (actors/envs/guard/): blocking calls on the loop, closes given up, worker processes
        self.env_loop_blocks = Counter(
            "turnstream_actor_env_loop_blocks_total",
            "Environment calls that held the actor's event loop longer than env.loop_block_warn_s at a stretch, "
            "by environment", ["env"], registry=r)
        self.env_loop_blocked_seconds = Counter(
            "turnstream_actor_env_loop_blocked_seconds_total",
            "Seconds environment calls held the actor's event loop in stretches over env.loop_block_warn_s, "
            "by environment", ["env"], registry=r)
        self.env_loop_stalls = Counter(
            "turnstream_actor_env_loop_stalls_total",
            "Environment calls seen by the loop watchdog holding the actor's event loop past their time limit, by "
            "environment and call (one still holding it after the grace ends the actor)", ["env", "call"],
            registry=r)
        self.env_close_failures = Counter("turnstream_actor_env_close_failures_total",
                                          "Environment closes that failed or ran out of time, by kind (the slot "
                                          "goes on)", ["kind"], registry=r)
        self.env_worker_restarts = Counter("turnstream_actor_env_worker_restarts_total",
                                           "Environment worker processes replaced (env.isolation = process), by "
                                           "reason: died, memory, hung", ["reason"], registry=r)
        self.env_workers_alive = Gauge("turnstream_actor_env_workers_alive",
                                       "Environment worker processes running (env.isolation = process)", registry=r)
        # the inference fleet
        self.inference_retries = Counter("turnstream_actor_inference_retries_total",
                                         "Generate tries after a failed one: on another server at once, or on any "
                                         "server that answers after a back-off", registry=r)
        self.inference_give_ups = Counter("turnstream_actor_inference_give_ups_total",
                                          "Generate calls that no server served by their deadline "
                                          "(actor.request_timeout_s from the first try); their episodes are "
                                          "abandoned", registry=r)
        self.server_failures = Counter("turnstream_actor_server_failures_total",
                                       "Failed generate calls or health checks, by server", ["server"], registry=r)
        self.server_usable = Gauge("turnstream_actor_server_usable",
                                   "1 if a server gets requests (healthy, version within the staleness bound)",
                                   ["server"], registry=r)
        self.server_outstanding = Gauge("turnstream_actor_server_outstanding_requests",
                                        "Requests in flight, by server", ["server"], registry=r)
        self.server_busy_seconds = Counter(
            "turnstream_actor_server_busy_seconds",
            "Seconds during which at least one request was in flight to the server (union of request intervals)",
            ["server"], registry=r)
        self.unacked = Gauge("turnstream_actor_unacked_chunks", "Chunks awaiting an ack", registry=r)
        self.running = Gauge("turnstream_actor_running_episodes", "Episodes in flight", registry=r)
        self.episodes_waiting_on_env = Gauge(
            "turnstream_actor_episodes_waiting_on_env",
            "Episodes in flight inside an environment call (others may start meanwhile, up to "
            "actor.max_episodes_in_flight)", registry=r)
        self.credit_wait_seconds = Counter("turnstream_actor_credit_wait_seconds",
                                           "Seconds the actor spent waiting for a credit to start its next episode",
                                           registry=r)
        self.tracker_values = Gauge("turnstream_actor_curriculum_values",
                                    "Prompt keys with a value of the learner's SPO tracker (tasks.order = spo)",
                                    registry=r)
        self.generate_seconds = Histogram("turnstream_actor_generate_seconds", "Latency of one generate call",
                                          buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
                                          registry=r)
        # held-out evaluation (tasks.eval_split; actors/evaluation.py): played, never streamed
        self.eval_episodes = Counter("turnstream_actor_eval_episodes_total",
                                     "Evaluation episodes (held-out tasks, never streamed) finished, by outcome",
                                     ["outcome"], registry=r)
        self.eval_success = Gauge("turnstream_actor_eval_success_ratio",
                                  "Success rate of this actor's part of the last evaluation round", registry=r)
        self.eval_version = Gauge("turnstream_actor_eval_learner_version",
                                  "Learner version of the last evaluation round (a multiple of tasks.eval_every)",
                                  registry=r)
