"""A run across hosts (tests/cluster_stack.py): vLLM, the buffer and the learner on a host each, actors on
two more, every ZeroMQ socket under CURVE with an allow-list, every role's /metrics scraped from another
host, each host's run files in its own directory. A third actor host joins mid-run and the first one leaves
(a graceful stop); the demo task still reaches its target, and the audit trail (tests/fault/ledger.py)
accounts for every acked chunk of every actor, the one that joined and the one that left included: trained
once, still held in the buffer's log, or dropped for a recorded reason. Skipped, saying why, where network
namespaces cannot be made."""
from __future__ import annotations

import pytest

from tests.cluster import Cluster, cluster_unavailable
from tests.cluster_stack import (ACTOR_METRICS, BUFFER_METRICS, LEARNER_METRICS, VLLM_PORT, ClusterStack,
                                 episodes_played, hosts)
from tests.helpers import poll_until
from turnstream.reports.run_log import rolling_success

pytestmark = [pytest.mark.e2e, pytest.mark.vllm,
              pytest.mark.skipif(bool(reason := cluster_unavailable()), reason=reason or "")]


def test_a_run_across_five_hosts_with_an_actor_host_joining_and_one_leaving(tiny_model, tmp_path):
    with Cluster(hosts(3)) as cluster:
        stack = ClusterStack(cluster, tmp_path, tiny_model, actors=3, env={"TURNSTREAM_AUDIT": "1"})
        try:
            stack.start(first_actors=2)
            poll_until(lambda: len(stack.steps()) >= 4, "four learner steps", 300)
            observer = cluster["actor1"]  # every role's /metrics, read from a host that is none of them
            for host, port in (("buffer", BUFFER_METRICS), ("learner", LEARNER_METRICS), ("actor0", ACTOR_METRICS)):
                assert "turnstream_" in observer.get(stack.url(host, port)), host
            assert "vllm:" in observer.get(stack.url("vllm", VLLM_PORT))

            stack.start_actor(2)  # a third actor host joins
            joiner = stack.url("actor2", ACTOR_METRICS + 2)
            poll_until(lambda: episodes_played(observer.get(joiner)) > 0, "the joining actor's first episodes", 120)
            joined_at = len(stack.steps())
            stack.stop("actor0")  # the first actor host leaves: its open episodes drain
            reached = poll_until(lambda: rolling_success(s := stack.steps(), stack.cfg.run.rolling_episodes) >= 0.9
                                 and s, "rolling success 0.9", 600)
            assert len(reached) > joined_at
            led = stack.close_books()
        finally:
            stack.procs.stop_all()
        assert {key[0] for key in led.ok_acks} == {"actor-0", "actor-1", "actor-2"}  # the leaver and the joiner
