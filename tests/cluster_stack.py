"""Every role of a run on a host of its own (tests/cluster.py): vLLM, buffer and learner on one host each,
actor i on host `actor{i}`; CURVE on every ZeroMQ socket, with the client key on the allow-list. Roles read a
config of their own that differs only in the address they bind and in their host's own directories.

Each host keeps its files apart, as separate machines would (deploy/README.md, "Across machines"):
`hosts/<host>/` holds the host's config, its run directory (`run/`) and its copy of the key files its role
needs (`keys/`); `shared/` holds only what the README names as shared: the weights directory the learner
writes and the vLLM servers read (the disk weight-sync backend). The model directory is read-only, the same
on every host (a copy each would do). `stack.run_dir_of(host)` is where a role's run files are
(learner.jsonl, audit/, buffer-wal/).

The caller stops what it started (`stack.procs.stop_all()`), the cluster then removes the hosts. A test may
start a single role (`start_role`) on a cluster that has only the hosts it needs."""
from __future__ import annotations

import shutil
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster import Cluster
from tests.fault.ledger import Ledger
from tests.helpers import wait_for_child
from benchmarks.chaos_audit import held_in_log
from turnstream.core.config import Config
from turnstream.keygen import main as keygen
from turnstream.launch.processes import Child, ProcessGroup
from turnstream.protocol.auth import ALLOWED_DIR, CLIENT_SECRET, SERVER_PUBLIC, SERVER_SECRET
from turnstream.reports.run_log import read_steps

VLLM_PORT, INGEST_PORT, SERVE_PORT, PUB_PORT = 8000, 5555, 5556, 5557
BUFFER_METRICS, LEARNER_METRICS, ACTOR_METRICS = 9100, 9101, 9102  # actor i: 9102 + i
ROLE = [sys.executable, "-m", "turnstream.cli"]
# the key files each role's host gets (deploy/README.md, "Authentication"): binding roles the server secret and
# the allow-list, actors (which only connect) the server's public key and their own secret
BINDING_KEYS = (SERVER_SECRET, CLIENT_SECRET, ALLOWED_DIR)
KEYS_OF = {"buffer": BINDING_KEYS, "learner": BINDING_KEYS, "actor": (SERVER_PUBLIC, CLIENT_SECRET),
           "vllm": ()}  # HTTP only


def hosts(actors: int) -> list[str]:
    return ["vllm", "buffer", "learner", *(f"actor{i}" for i in range(actors))]


def role_of(host: str) -> str:
    return "actor" if host.startswith("actor") else host


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
        keys = self.tmp_path / "keys"  # made here, then each host gets a copy of the files its role needs
        assert keygen(keys) == 0
        cfg = Config()  # the embedded default: the demo's task and settings
        cfg.model.path = str(self.model)
        cfg.run.run_dir = str(self.tmp_path / "run")  # replaced by the host's own in each role's config
        cfg.learner.weights_dir = str(self.shared_dir / "weights")
        net = cfg.network
        net.curve, net.keys_dir = "on", str(keys)
        net.buffer_host, net.learner_host = self._address("buffer"), self._address("learner")
        net.buffer_ingest_port, net.buffer_serve_port, net.learner_pub_port = INGEST_PORT, SERVE_PORT, PUB_PORT
        cfg.buffer.metrics_port, cfg.learner.metrics_port = BUFFER_METRICS, LEARNER_METRICS
        cfg.actor.metrics_port, cfg.actor.num_processes = ACTOR_METRICS, self.actors
        cfg.vllm.urls = [f"http://{self._address('vllm')}:{VLLM_PORT}"]  # no server-list file to share
        self.cfg = cfg
        self.procs = ProcessGroup(self.tmp_path)

    def _address(self, host: str) -> str:
        """The host's address; a role's own when the cluster has no host for it (it is not started)."""
        return self.cluster.hosts[host].address if host in self.cluster.hosts else "127.0.0.1"

    @property
    def shared_dir(self) -> Path:
        """What the hosts share: the learner's weights directory, which the vLLM servers read."""
        return self.tmp_path / "shared"

    def host_dir(self, host: str) -> Path:
        return self.tmp_path / "hosts" / host

    def run_dir_of(self, host: str) -> Path:
        """The run directory of the role on `host`: its logs, audit trail and state, seen by no other host."""
        return self.host_dir(host) / "run"

    def url(self, host: str, port: int, path: str = "/metrics") -> str:
        return f"http://{self.cluster[host].address}:{port}{path}"

    def _config_for(self, host: str) -> str:
        """The run's config as the role on `host` reads it: it binds its own address, and its run directory
        and key files are its host's own."""
        cfg = self.cfg.model_copy(deep=True)
        cfg.network.bind_host = self.cluster[host].address
        cfg.run.run_dir = str(self.run_dir_of(host))
        cfg.network.keys_dir = str(self._copy_keys(host))
        path = self.host_dir(host) / "config.toml"
        path.write_text(cfg.dumps())
        return str(path)

    def _copy_keys(self, host: str) -> Path:
        source, copy = Path(self.cfg.network.keys_dir), self.host_dir(host) / "keys"
        if not copy.exists():
            copy.mkdir(parents=True)
            for name in KEYS_OF[role_of(host)]:
                (shutil.copytree if (source / name).is_dir() else shutil.copy2)(source / name, copy / name)
        return copy

    def start(self, first_actors: int) -> None:
        """vLLM (waited for), the buffer, the learner and actors 0 .. first_actors - 1."""
        vllm = self.children["vllm"] = self.procs.start("vllm-0", self.cluster["vllm"].command(
            [*ROLE, "vllm", "--config", self._config_for("vllm"), "--port", str(VLLM_PORT)]))
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

    def start_actor(self, i: int, env: dict | None = None) -> Child:
        host = f"actor{i}"
        child = self.children[host] = self.procs.start(f"actor-{i}", self.cluster[host].command(
            [*ROLE, "actor", "--config", self._config_for(host), "--index", str(i)]), env)
        return child

    def stop(self, host: str) -> None:
        """A graceful stop (SIGTERM) of the role on `host`, which must end cleanly."""
        child = self.children.pop(host)
        child.proc.send_signal(signal.SIGTERM)
        assert child.proc.wait(timeout=self.cfg.launch.drain_timeout_s + 30) == 0, child.name

    def close_books(self) -> Ledger:
        """Stop every role in the order that leaves nothing in flight (the actors; the learner, which trains
        the batch its last request brings; the buffer, its log synced), then check the audit trail (the buffer
        and the learner run with TURNSTREAM_AUDIT=1): nothing ingested or trained twice, every served batch
        trained within the staleness bound, and every acked chunk trained, held in the buffer's log, or
        dropped for a recorded reason."""
        for host in [h for h in self.children if h.startswith("actor")] + ["learner", "buffer"]:
            self.stop(host)
        buffer_run = self.run_dir_of("buffer")
        led = Ledger.read(self.run_dir_of("learner"), buffer_run)
        assert led.steps, "no audit trail: run the buffer and the learner with TURNSTREAM_AUDIT=1"
        assert led.double_ingested() == [] and led.trained_twice() == [] and led.malformed_trained() == []
        assert max(rec["staleness_max"] for _, rec in led.steps) <= self.cfg.buffer.max_staleness
        assert led.untrained_served(set(led.trained_counts())) == [], "a served batch was never trained"
        led.check_accounted(held_in_log(buffer_run / "buffer-wal" / "wal.log", self.cfg.buffer, self.tmp_path))
        return led

    def metrics_of(self, host: str) -> str:
        """The /metrics text of the role on `host` (buffer, learner or an actor), read from inside that host, so
        whatever the state of its link."""
        port = {"buffer": BUFFER_METRICS, "learner": LEARNER_METRICS}.get(host)
        if port is None:
            port = ACTOR_METRICS + int(host.removeprefix("actor"))
        return self.cluster[host].get(self.url(host, port))

    def steps(self) -> list[dict]:
        """The learner's steps so far; fails at once if a role exited."""
        for child in self.children.values():
            assert child.proc.poll() is None or child.proc.returncode == 0, f"{child.name} exited"
        run_dir = self.run_dir_of("learner")
        return read_steps(run_dir) if (run_dir / "learner.jsonl").exists() else []


def metric_total(metrics: str, prefix: str) -> float:
    """The sum of the samples in /metrics text whose line starts with `prefix` (a name, and labels in the
    alphabetical order prometheus_client writes them in), as read across hosts with Host.get."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(prefix))


def episodes_played(metrics: str) -> float:
    """An actor's episodes, every outcome, from its /metrics text."""
    return metric_total(metrics, "turnstream_actor_episodes_total{")
