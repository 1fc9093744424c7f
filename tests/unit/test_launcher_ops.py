"""The launcher's own /metrics and /healthz, its metrics-port choice and its Prometheus discovery files."""
from __future__ import annotations

import json
import socket
import sys
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from turnstream.core.config import Config
from turnstream.launch.metrics import LauncherMetrics, MetricsThread
from turnstream.launch.processes import ProcessGroup, free_port, free_port_block
from turnstream.launch.scrape_targets import write_scrape_targets
from turnstream.launch.stack import resolve
from turnstream.reference.metrics import lint_exposition


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


@pytest.fixture
def procs(tmp_path):
    group = ProcessGroup(tmp_path)
    yield group
    group.stop_all(timeout_s=5)  # by PID, whatever a test left running


def test_launcher_metrics_follow_processes_and_lint_clean(procs):
    metrics = LauncherMetrics(procs)
    server = MetricsThread(metrics.registry, "127.0.0.1", 0, metrics.health)
    port = server.start()
    try:
        sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
        for name in ("buffer", "actor-0", "actor-1"):
            procs.start(name, sleeper)
            metrics.started(name)
        procs.start("quitter", [sys.executable, "-c", "pass"]).proc.wait()

        status, body = _get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        assert lint_exposition(body, role="launcher") == {}
        assert 'turnstream_launcher_processes_running{role="actor"} 2.0' in body
        assert 'turnstream_launcher_processes_expected{role="actor"} 2.0' in body
        assert 'turnstream_launcher_process_starts_total{role="buffer"} 1.0' in body
        assert 'turnstream_launcher_process_starts_total{role="learner"} 0.0' in body
        assert 'role="launcher"' in body  # build info

        procs.children[1].proc.kill()
        procs.children[1].proc.wait()
        _, body = _get(f"http://127.0.0.1:{port}/metrics")
        assert 'turnstream_launcher_processes_running{role="actor"} 1.0' in body  # read at scrape time

        status, health = _get(f"http://127.0.0.1:{port}/healthz")
        health = json.loads(health)
        assert status == 200 and health["processes"]["buffer"] == "running"
        assert health["processes"]["actor-0"].startswith("exited")
        assert _get(f"http://127.0.0.1:{port}/nope")[0] == 404
    finally:
        server.stop()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_metrics_thread_reports_a_port_conflict_to_the_caller():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError):
            MetricsThread(CollectorRegistry(), "127.0.0.1", port).start()


def test_two_metrics_threads_have_isolated_registries(procs):
    a, b = LauncherMetrics(procs), LauncherMetrics(procs)
    servers = [MetricsThread(m.registry, "127.0.0.1", 0) for m in (a, b)]
    ports = [s.start() for s in servers]
    try:
        a.started("vllm-0")
        assert 'process_starts_total{role="vllm"} 1.0' in _get(f"http://127.0.0.1:{ports[0]}/metrics")[1]
        assert 'process_starts_total{role="vllm"} 0.0' in _get(f"http://127.0.0.1:{ports[1]}/metrics")[1]
    finally:
        for s in servers:
            s.stop()


def test_free_port_block_is_consecutive_and_free():
    base = free_port_block("127.0.0.1", 4)
    socks = []
    try:
        for port in range(base, base + 4):
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", port))
    finally:
        for s in socks:
            s.close()


def test_free_ports_are_never_handed_out_twice():
    """A caller binds its port only later, so a port drawn twice would be bound by two roles: 2000 draws out of
    about 12000 ports would repeat one about 160 times over if each draw forgot the ones before."""
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)
    blocks = [free_port_block("127.0.0.1", 4) for _ in range(50)]
    taken = [p for base in blocks for p in range(base, base + 4)]
    assert len(set(taken)) == len(taken) and set(taken).isdisjoint(ports)


def test_resolve_picks_metrics_ports_and_keeps_given_ones(tmp_path):
    cfg = Config()
    cfg.run.run_dir = str(tmp_path / "run")
    cfg.actor.num_processes = 3
    cfg.learner.metrics_port = 9876
    r = resolve(cfg)
    assert r.learner.metrics_port == 9876
    assert r.buffer.metrics_port > 0 and r.actor.metrics_port > 0
    assert cfg.buffer.metrics_port == 0  # the caller's config is not modified


def test_scrape_targets_list_every_role(tmp_path):
    cfg = Config()
    cfg.run.run_dir = str(tmp_path / "run")
    cfg.run.name = "t"
    cfg.actor.num_processes = 2
    cfg.vllm.urls = ["http://127.0.0.1:8000", "http://127.0.0.1:8001/"]
    r = resolve(cfg)
    path = write_scrape_targets(r, 7000)
    groups = {g["labels"]["role"]: g for g in json.loads(path.read_text())}
    assert set(groups) == {"launcher", "buffer", "learner", "actor"}
    assert groups["launcher"]["targets"] == ["127.0.0.1:7000"]
    assert groups["actor"]["targets"] == [f"127.0.0.1:{r.actor.metrics_port}", f"127.0.0.1:{r.actor.metrics_port + 1}"]
    assert all(g["labels"]["run"] == "t" for g in groups.values())
    vllm = json.loads((path.parent / "vllm.json").read_text())
    assert vllm[0]["targets"] == ["127.0.0.1:8000", "127.0.0.1:8001"]


def test_a_role_started_with_cpus_runs_pinned_to_them(procs):
    """`<role>.cpus` pins a role and everything it starts (vLLM's engine process inherits the mask)."""
    script = "import os, subprocess, sys; print(sorted(os.sched_getaffinity(0))); sys.stdout.flush(); " \
             "subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'])"
    child = procs.start("pinned", [sys.executable, "-c", script], cpus=[0])
    assert child.proc.wait(30) == 0
    assert child.log_path.read_text().split() == ["[0]", "[0]"]


def test_cpus_outside_the_machine_are_a_one_line_config_error():
    from turnstream.core.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"^learner\.cpus: CPU ids must be in 0\.\.") as err:
        load_config(None, ["learner.cpus=[4096]"])
    assert "\n" not in str(err.value)
