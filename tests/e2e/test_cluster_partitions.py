"""Partitions between hosts (tests/cluster_stack.py): a host's link is cut for longer than every heartbeat
and timeout (its port on the switch down: packets vanish, no connection is reset), then restored. The run
carries on with what is reachable and takes the host back; nothing is ingested or trained twice and the
staleness bound holds (the buffer's and the learner's audit trails, tests/fault/ledger.py). The time from the
link's return to the first trained turn from that host is printed as a JSON line. Skipped, saying why, where
network namespaces cannot be made."""
from __future__ import annotations

import json
import time

import pytest

from tests.cluster import Cluster, cluster_unavailable
from tests.cluster_stack import ClusterStack, hosts
from tests.fault.ledger import Ledger, read_lines
from tests.helpers import poll_until
from turnstream.report import read_steps

pytestmark = [pytest.mark.e2e, pytest.mark.vllm,
              pytest.mark.skipif(bool(reason := cluster_unavailable()), reason=reason or "")]


def first_trained_after(stack: ClusterStack, actor_id: str, since: float) -> float | None:
    """When the learner published the first step, after `since`, that trained an episode of `actor_id`."""
    published = {s["version"]: s["time"] for s in stack.steps()}
    for line in read_lines(stack.run_dir / "audit" / "learner.jsonl"):
        at = published.get(line.get("version"), 0.0)
        if at > since and any(e.startswith(f"{actor_id}-") for e in line.get("episodes", ())):
            return at
    return None


def first_step_after(stack: ClusterStack, since: float) -> float | None:
    return next((s["time"] for s in stack.steps() if s["time"] > since), None)


# (host cut, cut seconds, what counts as that host's first trained turn after the link returns)
CUTS = [("actor1", 60, lambda stack, back: first_trained_after(stack, "actor-1", back)),
        ("learner", 30, first_step_after),  # the learner's host: it trains again
        ("buffer", 30, first_step_after)]  # the buffer's host: it serves a batch again


@pytest.mark.parametrize(("host", "cut_s", "first_trained"), CUTS, ids=[c[0] for c in CUTS])
def test_a_host_cut_for_longer_than_every_timeout_is_trained_from_again_once_its_link_returns(
        tiny_model, tmp_path, host, cut_s, first_trained):
    with Cluster(hosts(2)) as cluster:
        stack = ClusterStack(cluster, tmp_path, tiny_model, actors=2, env={"TURNSTREAM_AUDIT": "1"})
        try:
            stack.start(first_actors=2)
            poll_until(lambda: first_trained_after(stack, "actor-1", 0.0), "a trained episode of actor-1", 300)
            cluster.cut(host)
            time.sleep(cut_s)
            cluster.restore(host)
            back = time.time()
            trained = poll_until(lambda: first_trained(stack, back), f"training from {host} again", 180)
            print(json.dumps({"partition": host, "cut_s": cut_s,
                              "return_to_first_trained_turn_s": round(trained - back, 1)}))
        finally:
            stack.procs.stop_all()
        ledger = Ledger.read(stack.run_dir)
        assert ledger.double_ingested() == [] and ledger.trained_twice() == []
        assert max(s["staleness_max"] for s in read_steps(stack.run_dir)) <= stack.cfg.buffer.max_staleness
