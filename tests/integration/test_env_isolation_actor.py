"""A crashing environment under env.isolation = "process", through a real actor process, buffer and vLLM server:
worker segfaults abandon only their episodes (counted by reason in the actor's /metrics), the workers are
replaced, the actor keeps streaming, and when the actor stops (SIGTERM) none of its workers is left."""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import poll_until, scrape, session_server_config
from turnstream.launch.processes import ProcessGroup, free_port, tail

pytestmark = pytest.mark.vllm


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(c) for c in (task / "children").read_text().split()}
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def test_a_crashing_environment_in_workers_never_stops_the_actor(vllm_url, tiny_model, tmp_path):
    cfg = session_server_config(vllm_url, tiny_model, tmp_path)
    cfg.env.name = "probe_crash"
    cfg.env.args = {"every": 40, "how": "segfault", "turns": 2}
    cfg.env.isolation, cfg.env.workers = "process", 2
    cfg.actor.concurrent_episodes = 16
    cfg.actor.metrics_port, cfg.buffer.metrics_port = free_port(), free_port()
    cfg.launch.drain_timeout_s = 5.0
    config = tmp_path / "run.toml"
    config.write_text(cfg.dumps())
    metrics_url = f"http://127.0.0.1:{cfg.actor.metrics_port}/metrics"
    role = [sys.executable, "-m", "turnstream.cli"]
    procs = ProcessGroup(tmp_path)
    try:
        procs.start("buffer", [*role, "buffer", "--config", str(config)])
        actor = procs.start("actor", [*role, "actor", "--config", str(config), "--index", "0"])

        def value(m: dict, key: str) -> float:
            return m.get(key, 0.0)

        def alive_check() -> None:
            assert all(c.proc.poll() is None for c in procs.children), \
                "\n".join(f"--- {c.name}\n{tail(c.log_path, 30)}" for c in procs.children)

        def crashed_twice():
            m = scrape(metrics_url)
            return m if value(m, 'turnstream_actor_env_worker_restarts_total{reason="died"}') >= 2 else None

        first = poll_until(crashed_twice, "two worker crashes", 240, check=alive_check,
                           context=lambda: tail(actor.log_path, 30))
        done_key = 'turnstream_actor_episodes_total{outcome="done"}'
        done_before = value(first, done_key)
        # the actor keeps finishing episodes after the crashes, on the replaced workers
        later = poll_until(lambda: (m := scrape(metrics_url)) and value(m, done_key) >= done_before + 10 and m,
                           "episodes done after the crashes", 120, check=alive_check,
                           context=lambda: tail(actor.log_path, 30))
        lost = value(later, 'turnstream_actor_env_errors_total{kind="worker_died"}')
        replaced = value(later, 'turnstream_actor_env_worker_restarts_total{reason="died"}')
        print(f"isolation: {done_before:.0f} episodes done before the second crash, {value(later, done_key):.0f} "
              f"after, {lost:.0f} abandoned as worker_died, {replaced:.0f} workers replaced")
        assert lost >= 2  # each of the two crashes abandoned at least the episode that crashed its worker
        assert value(later, 'turnstream_actor_episodes_total{outcome="env_error"}') == lost
        # crashes go on all the while (one episode in 40): each dead worker is replaced, so both are soon up again
        def both_workers_up() -> set[int] | None:
            workers = {p for p in _children(actor.proc.pid) if _alive(p)}
            up = value(scrape(metrics_url), "turnstream_actor_env_workers_alive") == 2 and len(workers) == 2
            return workers if up else None

        workers = poll_until(both_workers_up, "two workers up", 30, check=alive_check)
        os.kill(actor.proc.pid, signal.SIGTERM)  # a graceful stop
        actor.proc.wait(60)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(p) for p in workers), "a worker outlived its stopped actor"
    finally:
        procs.stop_all()
