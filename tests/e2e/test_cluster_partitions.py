"""Partitions between hosts (tests/cluster_stack.py), one run, one host at a time: an actor host's link is cut
for 40 s, then the learner's, a vLLM server's and the buffer's for 30 s each, longer
than every heartbeat (the host's port on the switch down: packets vanish, no connection is reset), and
restored. The run carries on with what is reachable and takes each host back; at the end the audit trail
(tests/fault/ledger.py) shows nothing ingested or trained twice, nothing acked lost and the staleness bound held.

For each cut a JSON line gives the seconds from the link's return to the first trained turn from that host,
the first learner step, published after the return, that trained
- actor host: a turn of that actor the buffer acked after the return;
- vLLM host, buffer host: any turn the buffer acked after the return (every turn is sampled by the one vLLM
  server and reaches the learner through the buffer, so it came over the restored link);
- learner host: any turn (the learner's host is where turns are trained).
Each cut starts from a steady run: every actor has a turn acked after the previous return trained. One run
for the four cuts: each case would otherwise start its own vLLM server. Skipped, saying why, where network
namespaces cannot be made.

Each cut's JSON line also counts the episodes it cost, from the roles' /metrics, between a reading just before
the cut and one taken once every loss it could cause has shown (the request deadline and the buffer's episode
timeout after the cut began): episodes the actors abandoned (`abandoned`, every failed outcome; among them those
whose generate request found no server by its deadline, `request_give_ups`), those the buffer dropped as `abandoned` (no chunk for
buffer.episode_timeout_s) and, for the record, as `stale` (past buffer.max_staleness; the learner trains on
while an actor is cut off). A cut shorter than `actor.request_timeout_s` by more than a request's longest pause
between retries (actors/inference/fleet.py) must abandon none: requests wait it out."""
from __future__ import annotations

import json
import time

import pytest

from tests.cluster import Cluster, cluster_unavailable
from tests.cluster_stack import ClusterStack, hosts, metric_total
from tests.fault.ledger import read_lines
from tests.helpers import poll_until
from turnstream.actors.inference.fleet import RETRY_MAX_DELAY_S
from turnstream.actors.play.runner import ABANDONED

pytestmark = [pytest.mark.e2e, pytest.mark.vllm,
              pytest.mark.skipif(bool(reason := cluster_unavailable()), reason=reason or "")]

ACTORS = 2
# (host, seconds its link is down)
CUTS = [("actor0", 40), ("learner", 30), ("vllm", 30), ("buffer", 30)]
REQUEST_TIMEOUT_S = 45.0  # longer than every cut by more than a request's longest pause
SETTLE_S = 5.0  # after the last moment a cut's loss could show, for the counters to be read


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


def episodes_lost(stack: ClusterStack) -> dict[str, float]:
    """Episodes lost so far, by how (see the module's doc), summed over the actors."""
    actors = [stack.metrics_of(f"actor{i}") for i in range(ACTORS)]
    buffer = stack.metrics_of("buffer")
    return {
        "abandoned": sum(metric_total(m, f'turnstream_actor_episodes_total{{outcome="{outcome}"}}')
                         for m in actors for outcome in ABANDONED),
        "request_give_ups": sum(metric_total(m, "turnstream_actor_inference_give_ups_total ") for m in actors),
        "buffer_abandoned": metric_total(buffer, 'turnstream_buffer_dropped_episodes_total{reason="abandoned"}'),
        "buffer_stale": metric_total(buffer, 'turnstream_buffer_dropped_episodes_total{reason="stale"}'),
    }


def test_each_host_cut_is_trained_from_again_once_its_link_returns_and_a_short_cut_loses_no_episode(
        tiny_model, tmp_path):
    with Cluster(hosts(ACTORS)) as cluster:
        stack = ClusterStack(cluster, tmp_path, tiny_model, actors=ACTORS, env={"TURNSTREAM_AUDIT": "1"})
        # limits as short as the cuts allow: every cut waits out the longest of them before its losses are read.
        # The demo task's steps are instant; a turn's worst case (request + step) stays inside the episode timeout.
        cfg = stack.cfg
        cfg.actor.request_timeout_s, cfg.env.step_timeout_s, cfg.buffer.episode_timeout_s = REQUEST_TIMEOUT_S, 5.0, 55.0
        # a loss can show up to this long after its cut began: a request's deadline, an episode's expiry
        loss_horizon_s = max(stack.cfg.actor.request_timeout_s, stack.cfg.buffer.episode_timeout_s) + SETTLE_S
        lost_by_short_cuts = {}
        try:
            stack.start(first_actors=ACTORS)
            back, mark = 0.0, 0
            for host, cut_s in CUTS:
                for i in range(ACTORS):  # steady again: a turn each actor played since the last return is trained
                    poll_until(lambda i=i: first_step_training(stack, acked_since(stack, mark, f"actor-{i}"), back),
                               f"a trained turn of actor-{i}", 300)
                before = episodes_lost(stack)
                cluster.cut(host)
                cut_at = time.monotonic()
                time.sleep(cut_s)
                mark = len(ok_acks(stack))  # none of the acks that follow needed the cut link before its return
                cluster.restore(host)
                back = time.time()
                trained = poll_until(lambda: first_trained_from(stack, host, back, mark),
                                     f"a trained turn from {host} after its link's return", 180)
                time.sleep(max(0.0, cut_at + loss_horizon_s - time.monotonic()))
                after = episodes_lost(stack)
                lost = {k: after[k] - before[k] for k in after}
                print(json.dumps({"partition": host, "cut_s": cut_s,
                                  "return_to_first_trained_turn_s": round(trained - back, 1),
                                  "episodes_lost": lost}), flush=True)
                if cut_s + RETRY_MAX_DELAY_S < stack.cfg.actor.request_timeout_s:
                    lost_by_short_cuts[f"{host} {cut_s} s"] = {k: v for k, v in lost.items() if k != "buffer_stale"}
            stack.close_books()
        finally:
            stack.procs.stop_all()
    assert {cut: lost for cut, lost in lost_by_short_cuts.items() if any(lost.values())} == {}
    assert len(lost_by_short_cuts) == len(CUTS)  # every cut is shorter than the deadline
