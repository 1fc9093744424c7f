"""Partitions between hosts (tests/cluster_stack.py), one run, one host at a time: an actor host's link is cut
for 60 s, then the learner's, a vLLM server's and the buffer's for 30 s each, longer than every heartbeat and
timeout (the host's port on the switch down: packets vanish, no connection is reset), and restored. The run
carries on with what is reachable and takes each host back; at the end the audit trail (tests/fault/ledger.py)
shows nothing ingested or trained twice, nothing acked lost and the staleness bound held.

For each cut a JSON line gives the seconds from the link's return to the first trained turn from that host,
the first learner step, published after the return, that trained
- actor host: a turn of that actor the buffer acked after the return;
- vLLM host, buffer host: any turn the buffer acked after the return (every turn is sampled by the one vLLM
  server and reaches the learner through the buffer, so it came over the restored link);
- learner host: any turn (the learner's host is where turns are trained).
Each cut starts from a steady run: every actor has a turn acked after the previous return trained. One run
for the four cuts: each case would otherwise start its own vLLM server. Skipped, saying why, where network
namespaces cannot be made."""
from __future__ import annotations

import json
import time

import pytest

from tests.cluster import Cluster, cluster_unavailable
from tests.cluster_stack import ClusterStack, hosts
from tests.fault.ledger import read_lines
from tests.helpers import poll_until

pytestmark = [pytest.mark.e2e, pytest.mark.vllm,
              pytest.mark.skipif(bool(reason := cluster_unavailable()), reason=reason or "")]

ACTORS = 2
CUTS = [("actor1", 60), ("learner", 30), ("vllm", 30), ("buffer", 30)]  # (host, seconds its link is down)


def ok_acks(stack: ClusterStack) -> list[dict]:
    """The buffer's first acks of chunks, in the order it acked them."""
    return [r for r in read_lines(stack.run_dir_of("buffer") / "audit" / "buffer.jsonl") if r.get("ack") == "ok"]


def acked_since(stack: ClusterStack, mark: int, actor: str = "") -> set[str]:
    """Episodes with a chunk first acked after the first `mark` acks (of `actor` when given)."""
    return {r["ep"] for r in ok_acks(stack)[mark:] if not actor or r["key"][0] == actor}


def first_step_training(stack: ClusterStack, episodes: set[str] | None, since: float) -> float | None:
    """When the learner published the first step, after `since`, that trained one of `episodes` (None: any)."""
    published = {s["version"]: s["time"] for s in stack.steps()}
    for line in read_lines(stack.run_dir_of("learner") / "audit" / "learner.jsonl"):
        at = published.get(line.get("version"), 0.0)
        if at > since and (episodes is None or episodes & set(line.get("episodes", ()))):
            return at
    return None


def actor_id(host: str) -> str:
    return f"actor-{host.removeprefix('actor')}"


def first_trained_from(stack: ClusterStack, host: str, back: float, mark: int) -> float | None:
    if host == "learner":
        return first_step_training(stack, None, back)
    return first_step_training(stack, acked_since(stack, mark, actor_id(host) if host.startswith("actor") else ""),
                               back)


def test_each_host_cut_for_longer_than_every_timeout_is_trained_from_again_once_its_link_returns(
        tiny_model, tmp_path):
    with Cluster(hosts(ACTORS)) as cluster:
        stack = ClusterStack(cluster, tmp_path, tiny_model, actors=ACTORS, env={"TURNSTREAM_AUDIT": "1"})
        try:
            stack.start(first_actors=ACTORS)
            back, mark = 0.0, 0
            for host, cut_s in CUTS:
                for i in range(ACTORS):  # steady again: a turn each actor played since the last return is trained
                    poll_until(lambda i=i: first_step_training(stack, acked_since(stack, mark, f"actor-{i}"), back),
                               f"a trained turn of actor-{i}", 300)
                cluster.cut(host)
                time.sleep(cut_s)
                mark = len(ok_acks(stack))  # none of the acks that follow needed the cut link before its return
                cluster.restore(host)
                back = time.time()
                trained = poll_until(lambda: first_trained_from(stack, host, back, mark),
                                     f"a trained turn from {host} after its link's return", 180)
                print(json.dumps({"partition": host, "cut_s": cut_s,
                                  "return_to_first_trained_turn_s": round(trained - back, 1)}), flush=True)
            stack.close_books()
        finally:
            stack.procs.stop_all()
