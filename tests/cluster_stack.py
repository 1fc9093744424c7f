"""Every role of a run on a host of its own (tests/cluster.py): vLLM, buffer and learner on one host each,
actor i on host `actor{i}`; CURVE on every ZeroMQ socket, with the client key on the allow-list. Roles read a
config of their own that differs only in the address they bind. The caller stops what it started
(`stack.procs.stop_all()`), the cluster then removes the hosts. A test may start a single role
(`start_role`) on a cluster that has only the hosts it needs."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster import Cluster
from tests.helpers import wait_for_child
from turnstream.core.config import Config
from turnstream.keygen import main as keygen
from turnstream.processes import Child, ProcessGroup
from turnstream.report import read_steps
from turnstream.vllm_server import vllm_command

VLLM_PORT, INGEST_PORT, SERVE_PORT, PUB_PORT = 8000, 5555, 5556, 5557
BUFFER_METRICS, LEARNER_METRICS, ACTOR_METRICS = 9100, 9101, 9102  # actor i: 9102 + i
ROLE = [sys.executable, "-m", "turnstream.cli"]


def hosts(actors: int) -> list[str]:
    return ["vllm", "buffer", "learner", *(f"actor{i}" for i in range(actors))]


@dataclass
class ClusterStack:
    cluster: Cluster
    tmp_path: Path
    model: Path | None = None  # the policy vLLM serves; only start() needs it
    actors: int = 1  # actor hosts the run is configured for (actor.num_processes)
    env: dict = field(default_factory=dict)  # for the buffer and the learner (e.g. TURNSTREAM_AUDIT)
    cfg: Config = field(init=False)
    procs: ProcessGroup = field(init=False)
    children: dict[str, Child] = field(default_factory=dict)

    def __post_init__(self):
        keys = self.tmp_path / "keys"
        assert keygen(keys) == 0
        cfg = Config()  # the embedded default: the demo's task and settings
        cfg.model.path = str(self.model)
        cfg.run.run_dir = str(self.tmp_path / "run")
        net = cfg.network
        net.curve, net.keys_dir = "on", str(keys)
        net.buffer_host, net.learner_host = self._address("buffer"), self._address("learner")
        net.buffer_ingest_port, net.buffer_serve_port, net.learner_pub_port = INGEST_PORT, SERVE_PORT, PUB_PORT
        cfg.buffer.metrics_port, cfg.learner.metrics_port = BUFFER_METRICS, LEARNER_METRICS
        cfg.actor.metrics_port, cfg.actor.num_processes = ACTOR_METRICS, self.actors
        cfg.vllm.urls = [f"http://{self._address('vllm')}:{VLLM_PORT}"]
        self.cfg = cfg
        self.procs = ProcessGroup(self.tmp_path)

    def _address(self, host: str) -> str:
        """The host's address; a role's own when the cluster has no host for it (it is not started)."""
        return self.cluster.hosts[host].address if host in self.cluster.hosts else "127.0.0.1"

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.run.run_dir)

    def url(self, host: str, port: int, path: str = "/metrics") -> str:
        return f"http://{self.cluster[host].address}:{port}{path}"

    def _config_for(self, host: str) -> str:
        """The run's config as the role on `host` reads it: it binds its own address."""
        cfg = self.cfg.model_copy(deep=True)
        cfg.network.bind_host = self.cluster[host].address
        path = self.tmp_path / f"{host}.toml"
        path.write_text(cfg.dumps())
        return str(path)

    def start(self, first_actors: int) -> None:
        """vLLM (waited for), the buffer, the learner and actors 0 .. first_actors - 1."""
        argv, env = vllm_command(str(self.model), self.cluster["vllm"].address, VLLM_PORT, self.cfg.vllm)
        vllm = self.children["vllm"] = self.procs.start("vllm-0", self.cluster["vllm"].command(argv), env)
        wait_for_child(lambda: self.cluster["learner"].get(self.url("vllm", VLLM_PORT, "/health")) is not None,
                       "vLLM on its host", vllm, timeout_s=300)
        for role in ("buffer", "learner"):
            self.start_role(role)
        for i in range(first_actors):
            self.start_actor(i)

    def start_role(self, role: str) -> Child:
        """The buffer or the learner on its host."""
        child = self.children[role] = self.procs.start(role, self.cluster[role].command(
            [*ROLE, role, "--config", self._config_for(role)]), self.env)
        return child

    def start_actor(self, i: int) -> Child:
        host = f"actor{i}"
        child = self.children[host] = self.procs.start(f"actor-{i}", self.cluster[host].command(
            [*ROLE, "actor", "--config", self._config_for(host), "--index", str(i)]))
        return child

    def steps(self) -> list[dict]:
        """The learner's steps so far; fails at once if a role exited."""
        for child in self.children.values():
            assert child.proc.poll() is None or child.proc.returncode == 0, f"{child.name} exited"
        return read_steps(self.run_dir) if (self.run_dir / "learner.jsonl").exists() else []


def episodes_played(metrics: str) -> float:
    """An actor's episodes, every outcome, from its /metrics text."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("turnstream_actor_episodes_total{"))
