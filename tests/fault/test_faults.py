"""Fault injection on one running stack: hostile bytes on every listening port, a stalled learner, kill -9 of
an actor mid-episode, of one of two inference servers, of the buffer and of the learner, then a final
account of every acked chunk.

The tests share one module-scoped stack (stack.py) and run in file order, each fault on top of the
previous ones, as faults pile up in a long run. After each fault every test checks the same invariants
(FaultStack.check_invariants): the serving processes are up and answer /healthz, the run goes on, no chunk
key was ingested twice and no episode trained twice, every trained episode is exactly its acked chunks,
no trained token is older than buffer.max_staleness, and the buffer stays within its memory bounds. The
last test accounts for every acked chunk (ledger.py).
"""
from __future__ import annotations

import os
import random
import signal
import time

import pytest
import zmq

from tests.fault.probes import (http_attacks, listening_ports, rss_bytes, zmq_undecodable, zmtp_garbage,
                                zmtp_oversized)
from tests.fault.stack import BUFFER_RSS_CAP, FaultStack, fault_config, restore_vllm, start_proxy
from tests.helpers import http_json
from benchmarks.chaos_audit import held_in_log
from turnstream.launch.processes import free_port
from turnstream.launch.stack import LocalStack

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]
ACTORS = ("actor-0", "actor-1")


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_model, vllm_url):
    tmp = tmp_path_factory.mktemp("faults")
    proxy_port = free_port()
    cfg = fault_config(tmp / "run", tiny_model, vllm_url, f"http://127.0.0.1:{proxy_port}")
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("TURNSTREAM_AUDIT", "1")  # every role writes its audit lines (core/audit.py)
            local = LocalStack(cfg)
            proxy = start_proxy(local.procs, proxy_port, vllm_url)
            with local:
                fs = FaultStack(local, proxy, f"http://127.0.0.1:{proxy_port}")
                fs.wait(lambda: fs.ledger().steps, "the first learner step", 240)
                yield fs
    finally:
        restore_vllm(vllm_url, tiny_model, tmp)


def _rejected(metrics: dict) -> float:
    return sum(v for k, v in metrics.items() if k.startswith("turnstream_buffer_rejected_total{"))


def test_garbage_and_oversized_frames_on_every_listening_port(stack: FaultStack):
    cfg, net = stack.cfg, stack.cfg.network
    targets = {
        "buffer": {net.buffer_ingest_port: "router", net.buffer_serve_port: "router", cfg.buffer.metrics_port: "http"},
        "learner": {net.learner_pub_port: "pub", cfg.learner.metrics_port: "http"},
        **{a: {stack.http_port(a): "http"} for a in ACTORS},
    }
    for name, ports in targets.items():  # every port a role listens on is attacked below, and only those
        assert listening_ports(stack.pid(name)) == set(ports), name
    rejected_before = _rejected(stack.metrics("buffer"))
    rng, ctx = random.Random(0), zmq.Context()
    oversized = 2 * net.max_message_bytes
    try:
        for name, ports in [*targets.items(), ("launcher", {stack.http_port("launcher"): "http"})]:
            for port, kind in ports.items():
                where = f"{name} port {port} ({kind})"
                if kind == "http":
                    for answer in http_attacks(port, rng):
                        assert answer == b"" or answer.startswith((b"HTTP/1.1 4", b"HTTP/1.0 4")), (where, answer)
                    continue
                assert zmtp_garbage(port, rng), f"{where} kept a connection that sent garbage"
                peer = "DEALER" if kind == "router" else "SUB"
                assert zmtp_oversized(port, peer, claimed=1 << 40), f"{where} kept a peer announcing 1 TiB"
                # a SUB's messages are subscriptions (first byte 1): a real 2 MiB one at the PUB
                assert zmtp_oversized(port, peer, claimed=oversized, payload=b"\x01" + b"s" * (oversized - 1)), \
                    f"{where} kept a peer sending {oversized} bytes"
                if kind == "router":
                    zmq_undecodable(ctx, port, oversized)
    finally:
        ctx.destroy(linger=0)
    # the four undecodable messages per ROUTER were read, rejected with a reason and counted
    stack.wait(lambda: _rejected(stack.metrics("buffer")) >= rejected_before + 8, "the rejections counted")
    for name in targets:
        assert stack.alive(name) and stack.health(name)["status"] == "ok", name
    stack.progress()
    stack.check_invariants()


def _stop_learner_between_pushes(stack: FaultStack, attempts: int = 5) -> int:
    """SIGSTOP the learner just after a step's line in learner.jsonl, i.e. after its push resumed the servers.

    A learner stopped between a push's pause and resume leaves every server paused (vLLM has no pause
    timeout), so the actors would wait on the servers and admission control would never be exercised. If
    the stop still lands inside a push (the test process was descheduled), let it finish and try again.
    """
    log, pid = stack.run_dir / "learner.jsonl", stack.pid("learner")
    vllm = stack.cfg.vllm.urls[0]
    for _ in range(attempts):
        size = log.stat().st_size
        deadline = time.monotonic() + 60
        while log.stat().st_size == size:  # a tight poll: the next push starts a whole step later
            assert time.monotonic() < deadline, "no learner step within 60 s"
            time.sleep(0.005)
        os.kill(pid, signal.SIGSTOP)
        if not http_json(f"{vllm}/is_paused")["is_paused"]:
            return pid
        os.kill(pid, signal.SIGCONT)
    raise AssertionError(f"the learner was inside a weight push at each of {attempts} stops")


def test_stalled_learner_holds_actors_back_within_the_memory_bounds(stack: FaultStack):
    """SIGSTOP the learner for longer than the ZeroMQ heartbeat timeout (5 s): admission control must stop
    the actors (no unbounded buffering), and after SIGCONT the run goes on without losing a batch."""
    b = stack.cfg.buffer
    blocked = "turnstream_buffer_insert_blocked_seconds_total"
    blocked_before = stack.metrics("buffer")[blocked]
    learner = _stop_learner_between_pushes(stack)
    try:
        stalled_at = time.monotonic()

        def held_back() -> bool:
            m = stack.metrics("buffer")
            held = m['turnstream_buffer_items{state="ready"}'] + m['turnstream_buffer_items{state="running"}']
            assert held <= b.max_items, held
            assert rss_bytes(stack.pid("buffer")) < BUFFER_RSS_CAP
            # actors asked for credit and were refused for a while, and the stall outlasted the heartbeat
            return m[blocked] > blocked_before + 2.0 and time.monotonic() - stalled_at > 8.0

        stack.wait(held_back, "admission control holding the actors back", 90)
        for name in ("buffer", *ACTORS):
            assert stack.alive(name) and stack.health(name)["status"] == "ok", name
    finally:
        os.kill(learner, signal.SIGCONT)
    stack.progress()
    stack.check_invariants()


def _half_played(led, actor: str, epoch: int) -> set[str]:
    """Open episodes of that actor process: acked chunks, no final one, not dropped (yet)."""
    return {ep for ep, turns in led.chunks.items()
            if turns and next(iter(turns.values()))[0][:2] == (actor, epoch) and ep not in led.dropped
            and not any(done for _, done, _ in turns.values())}


def _freeze_mid_episode(stack: FaultStack, name: str, epoch: int, attempts: int = 20) -> set[str]:
    """SIGSTOP the actor at a moment it has half-played episodes; returns them.

    Episodes here take a few tens of milliseconds, and the actors often idle waiting for credit, so a kill at
    a random moment can fall between episodes. Frozen, the actor sends nothing more: once the chunks already
    on the wire are acked, its open episodes are final. If there are none, let it go and try again.
    """
    pid = stack.pid(name)
    for _ in range(attempts):
        stack.wait(lambda: _half_played(stack.ledger(), name, epoch), f"a half-played episode of {name}")
        os.kill(pid, signal.SIGSTOP)
        try:
            seen = None
            while (keys := {k for k in stack.ledger().ok_acks if k[:2] == (name, epoch)}) != seen:
                seen = keys  # chunks sent before the stop may still be arriving
                time.sleep(0.2)
            if open_episodes := _half_played(stack.ledger(), name, epoch):
                return open_episodes
        except BaseException:
            os.kill(pid, signal.SIGCONT)  # never leave a stopped actor behind for the next tests
            raise
        os.kill(pid, signal.SIGCONT)
    raise AssertionError(f"{name} had no half-played episode at any of {attempts} stops")


def test_actor_kill9_mid_episode(stack: FaultStack):
    name = "actor-1"
    epoch = max(k[1] for k in stack.ledger().ok_acks if k[0] == name)
    open_episodes = _freeze_mid_episode(stack, name, epoch)
    stack.kill9(name)  # SIGKILL ends a stopped process too
    # its half-played episodes are dropped for a counted reason: abandoned after buffer.episode_timeout_s
    # without a chunk, or stale first if the learner moves max_staleness versions on before that
    stack.wait(lambda: open_episodes <= set(stack.ledger().dropped), "the killed actor's open episodes dropped", 60)
    stack.restart(name)  # a new process: a new epoch, the same name and metrics port
    stack.progress()
    led = stack.check_invariants()
    assert {led.dropped[ep] for ep in open_episodes} <= {"abandoned", "stale"}
    assert not open_episodes & set(led.trained_counts())
    assert max(k[1] for k in led.ok_acks if k[0] == name) > epoch


def test_one_of_two_inference_servers_kill9(stack: FaultStack):
    usable = f'turnstream_actor_server_usable{{server="{stack.proxy_url}"}}'
    failures = f'turnstream_actor_server_failures_total{{server="{stack.proxy_url}"}}'
    for a in ACTORS:
        stack.wait(lambda a=a: stack.metrics(a).get(usable) == 1, f"{a} using both servers")
    stack.wait(lambda: "connection" in stack.proxy.log_path.read_text(), "requests through the second server")
    failures_before = {a: stack.metrics(a).get(failures, 0) for a in ACTORS}
    os.kill(stack.proxy.proc.pid, signal.SIGKILL)
    stack.proxy.proc.wait(10)
    for a in ACTORS:  # each actor notices (a failed request or health check) and stops using it
        stack.wait(lambda a=a: stack.metrics(a).get(usable) == 0
                   and stack.metrics(a).get(failures, 0) > failures_before[a],
                   f"{a} to take the dead server out")
    stack.progress()  # on the surviving server alone
    stack.check_invariants()  # includes: no rejected (corrupt) chunk reached the buffer


def test_buffer_kill9_and_restart(stack: FaultStack):
    stack.wait(lambda: stack.metrics("buffer")['turnstream_buffer_items{state="running"}'] > 0, "episodes in flight")
    stack.kill9("buffer")
    stack.restart("buffer")
    replayed = stack.wait(lambda: stack.metrics("buffer")["turnstream_buffer_wal_replayed_records_total"],
                          "the restarted buffer's /metrics")
    assert replayed > 0
    for a in ACTORS:  # each actor saw the new server id (and resent whatever was unacked)
        stack.wait(lambda a=a: "buffer restarted" in stack.child(a).log_path.read_text(), f"{a} to notice")
    stack.progress()  # the learner re-asked: training goes on
    stack.check_invariants()


def test_learner_kill9_resumes_from_its_checkpoint(stack: FaultStack):
    ckpts = stack.run_dir / "checkpoints"
    stack.wait(lambda: list(ckpts.glob("step-*")), "a checkpoint")
    stack.kill9("learner")
    latest = max(int(p.name.split("-")[1]) for p in ckpts.glob("step-*"))
    resumed = stack.resumed_at(stack.restart("learner"))
    assert resumed == latest  # the same version as its newest checkpoint, not 0
    stack.progress()
    led = stack.check_invariants()
    # the steps the killed process took after that checkpoint are lost with it (at-most-once training):
    # at most checkpoint_every - 1 steps, plus the one whose checkpoint it may have been writing
    undone_steps = [rec for inc, rec in led.steps if inc == 0 and rec["version"] > resumed]
    assert len(undone_steps) <= stack.cfg.learner.checkpoint_every


def test_every_acked_chunk_is_trained_held_or_dropped_for_a_reason(stack: FaultStack, tmp_path):
    b = stack.cfg.buffer
    for a in ACTORS:  # the audit against the actors' own books: no actor holds an ack the audit lacks
        acked = stack.acked(a)
        led = stack.ledger()
        epoch = max(k[1] for k in led.ok_acks if k[0] == a)
        assert acked <= sum(1 for k in led.ok_acks if k[:2] == (a, epoch)), a
    for a in ACTORS:  # stop producing
        child = stack.child(a)
        child.proc.send_signal(signal.SIGTERM)
        child.proc.wait(30)
    kills = stack.kills["learner"]

    def drained() -> bool:
        # The ready count first: once it is below a batch, with the actors stopped, the buffer serves nothing
        # more, so the ledger read after it holds every batch ever served. Read the other way round, a batch
        # served between the read and the scrape would be missed here and found untrained at the end.
        if stack.metrics("buffer")['turnstream_buffer_items{state="ready"}'] >= b.batch_episodes:
            return False
        led = stack.ledger()
        trained = set(led.trained_counts())
        return not [r for r in led.untrained_served(trained) if not led.excused(r, kills)]

    stack.wait(drained, "the learner to train every batch served")
    buffer = stack.child("buffer")
    buffer.proc.send_signal(signal.SIGTERM)  # a clean stop: a waiting request is answered "cancelled"
    buffer.proc.wait(30)
    led = stack.ledger()
    held = held_in_log(stack.run_dir / "buffer-wal" / "wal.log", b, tmp_path)

    trained = set(led.trained_counts())
    lost_batches = [r for r in led.untrained_served(trained)]
    assert all(led.excused(r, kills) for r in lost_batches), "a served batch vanished outside a crash window"
    assert len(lost_batches) <= stack.kills["buffer"] + 2 * kills
    in_flight = {ep for _, _, eps in lost_batches for ep in eps}
    led.check_accounted(held, in_flight)
    undone = led.undone_by_learner_crash()
    print(f"faults: {len(led.ok_acks)} chunks acked in {len(led.chunks)} episodes; trained {len(trained)} "
          f"(of which {len(undone)} in steps undone by the learner kill), held {len(held)}, dropped "
          f"{len(led.dropped)} ({sorted(set(led.dropped.values()))}), in batches lost in a crash window "
          f"{len(in_flight)}")
