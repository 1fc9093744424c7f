"""A run across hosts (tests/cluster.py): vLLM, the buffer and the learner on a host each, actors on two more,
every ZeroMQ socket under CURVE with an allow-list, every role's /metrics scraped from another host. A third
actor host joins mid-run and the first one leaves (a graceful stop); the demo task still reaches its target.
Skipped, saying why, where network namespaces cannot be made."""
from __future__ import annotations

import signal
import sys

import pytest

from tests.cluster import Cluster, cluster_unavailable
from tests.helpers import poll_until, wait_for_child
from turnstream.core.config import Config
from turnstream.keygen import main as keygen
from turnstream.processes import ProcessGroup
from turnstream.report import read_steps, rolling_success
from turnstream.vllm_server import vllm_command

pytestmark = [pytest.mark.e2e, pytest.mark.vllm,
              pytest.mark.skipif(bool(reason := cluster_unavailable()), reason=reason or "")]

VLLM_PORT, INGEST_PORT, SERVE_PORT, PUB_PORT = 8000, 5555, 5556, 5557
BUFFER_METRICS, LEARNER_METRICS, ACTOR_METRICS = 9100, 9101, 9102  # actor i: 9102 + i
ACTORS = 3


def _episodes_played(metrics: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("turnstream_actor_episodes_total{"))


def _role_config(base: Config, cluster: Cluster, host: str, tmp_path) -> str:
    """The run's config as the role on `host` reads it: it binds its own address."""
    cfg = base.model_copy(deep=True)
    cfg.network.bind_host = cluster[host].address
    path = tmp_path / f"{host}.toml"
    path.write_text(cfg.dumps())
    return str(path)


def test_a_run_across_five_hosts_with_an_actor_host_joining_and_one_leaving(tiny_model, tmp_path):
    keys = tmp_path / "keys"
    assert keygen(keys) == 0
    hosts = ["vllm", "buffer", "learner", *(f"actor{i}" for i in range(ACTORS))]
    with Cluster(hosts) as cluster:
        cfg = Config()  # the embedded default: the demo's task and settings
        cfg.model.path = str(tiny_model)
        cfg.run.run_dir = str(tmp_path / "run")
        net = cfg.network
        net.curve, net.keys_dir = "on", str(keys)
        net.buffer_host, net.learner_host = cluster["buffer"].address, cluster["learner"].address
        net.buffer_ingest_port, net.buffer_serve_port, net.learner_pub_port = INGEST_PORT, SERVE_PORT, PUB_PORT
        cfg.buffer.metrics_port, cfg.learner.metrics_port = BUFFER_METRICS, LEARNER_METRICS
        cfg.actor.metrics_port, cfg.actor.num_processes = ACTOR_METRICS, ACTORS
        cfg.vllm.urls = [f"http://{cluster['vllm'].address}:{VLLM_PORT}"]
        role = [sys.executable, "-m", "turnstream.cli"]
        procs = ProcessGroup(tmp_path)
        try:
            argv, env = vllm_command(str(tiny_model), cluster["vllm"].address, VLLM_PORT, cfg.vllm)
            vllm = procs.start("vllm-0", cluster["vllm"].command(argv), env)
            wait_for_child(lambda: cluster["learner"].get(f"{cfg.vllm.urls[0]}/health") is not None,
                           "vLLM on its host", vllm, timeout_s=300)
            buffer = procs.start("buffer", cluster["buffer"].command(
                [*role, "buffer", "--config", _role_config(cfg, cluster, "buffer", tmp_path)]))
            learner = procs.start("learner", cluster["learner"].command(
                [*role, "learner", "--config", _role_config(cfg, cluster, "learner", tmp_path)]))

            def start_actor(i: int):
                host = f"actor{i}"
                return procs.start(f"actor-{i}", cluster[host].command(
                    [*role, "actor", "--config", _role_config(cfg, cluster, host, tmp_path), "--index", str(i)]))

            actors = [start_actor(0), start_actor(1)]
            run_dir = tmp_path / "run"

            def steps() -> list[dict]:
                for child in (vllm, buffer, learner, *actors):
                    assert child.proc.poll() is None, f"{child.name} exited"
                return read_steps(run_dir) if (run_dir / "learner.jsonl").exists() else []

            poll_until(lambda: len(steps()) >= 4, "four learner steps", 300)
            # every role's /metrics, read from a host that is none of them
            observer = cluster["actor1"]
            for url in (f"http://{cluster['buffer'].address}:{BUFFER_METRICS}/metrics",
                        f"http://{cluster['learner'].address}:{LEARNER_METRICS}/metrics",
                        f"http://{cluster['actor0'].address}:{ACTOR_METRICS}/metrics"):
                assert "turnstream_" in observer.get(url), url
            assert "vllm:" in observer.get(f"{cfg.vllm.urls[0]}/metrics")

            actors.append(start_actor(2))  # a third actor host joins
            joiner = f"http://{cluster['actor2'].address}:{ACTOR_METRICS + 2}/metrics"
            poll_until(lambda: _episodes_played(observer.get(joiner)) > 0, "the joining actor's first episodes",
                       120)
            joined_at = len(steps())
            leaving = actors.pop(0)  # the first actor host leaves: a graceful stop drains its episodes
            leaving.proc.send_signal(signal.SIGTERM)
            assert leaving.proc.wait(timeout=cfg.launch.drain_timeout_s + 30) == 0
            reached = poll_until(lambda: rolling_success(s := steps(), cfg.run.rolling_episodes) >= 0.9 and s,
                                 "rolling success 0.9", 600)
            assert len(reached) > joined_at
        finally:
            procs.stop_all()
        assert learner.proc.returncode is not None
