"""Every role as a separate local process (vLLM servers, buffer, learner, actors), started and stopped together:
`LocalStack`, which `turnstream up`, the demo, tests and benchmarks run."""
from __future__ import annotations

import copy
import logging
import signal
import sys
from pathlib import Path

from turnstream.checks.preflight import ensure_models, preflight
from turnstream.core.config import Config
from turnstream.core.urls_file import write_urls_file
from turnstream.launch.metrics import LauncherMetrics, MetricsThread, role_of
from turnstream.launch.peak_memory import record_peak_memory
from turnstream.launch.processes import Child, ProcessGroup, free_port, free_port_block, tail
from turnstream.launch.scrape_targets import remove_discovery_files, write_scrape_targets
from turnstream.launch.supervisor import RoleFailed, Supervisor
from turnstream.launch.vllm_restart import VllmRestarts
from turnstream.launch.vllm_server import vllm_command, wait_healthy

log = logging.getLogger("turnstream.launcher")
VLLM_STOP_TIMEOUT_S = 20.0


def _raise_on_sigterm(signum, _frame):
    raise SystemExit(128 + signum)  # unwinds through `finally`, which stops every child


def resolve(cfg: Config) -> Config:
    """Fill in ports left at 0 and absolute paths, so every role reads the same resolved file.

    Metrics ports are chosen here too (rather than by each role binding port 0), so that the resolved file
    and the scrape-target files say where every /metrics endpoint is.
    """
    cfg = copy.deepcopy(cfg)
    net = cfg.network
    for name in ("buffer_ingest_port", "buffer_serve_port", "learner_pub_port"):
        if getattr(net, name) == 0:
            setattr(net, name, free_port(net.host))
    for section in (cfg.buffer, cfg.learner):
        if section.metrics_port == 0:
            section.metrics_port = free_port(net.host)
    if cfg.actor.metrics_port == 0:  # actor i serves on metrics_port + i
        cfg.actor.metrics_port = free_port_block(net.host, cfg.actor.num_processes)
    cfg.run.run_dir = str(Path(cfg.run.run_dir).resolve())
    cfg.model.path = str(Path(cfg.model.path).resolve())
    if cfg.launch.policy("learner") == "on-failure":
        cfg.learner.checkpoint_every = restart_checkpoint_every(cfg)
    return cfg


def restart_checkpoint_every(cfg: Config) -> int:
    """The checkpoint interval of a learner that restarts on failure.

    A restarted learner resumes from its latest checkpoint, so it comes back up to `checkpoint_every` versions
    behind the version the buffer and the actors last heard of, and the buffer ignores versions it has seen.
    More than buffer.max_staleness behind, every server it pushes to looks too stale to the actors; more than
    buffer.eta behind, the buffer's admission (at most eta batches beyond the version it knows) has already
    admitted every episode it will until the learner passes that version again, which it cannot do without
    them. Either way nothing is generated again, so the interval is held to eta (eta <= max_staleness; at
    least 1), and 0, "never", becomes launch.learner_checkpoint_every first."""
    every = cfg.learner.checkpoint_every or cfg.launch.learner_checkpoint_every
    return max(1, min(every, cfg.buffer.eta))


class LocalStack:
    """Context manager: starts everything on enter, stops exactly what it started on exit.

    The launcher serves its own /metrics and /healthz on `metrics_port` (0: a free port), from the moment it
    starts, so a slow vLLM start-up is already visible.
    """

    def __init__(self, cfg: Config, metrics_port: int = 0):
        self.cfg = resolve(preflight(cfg))
        ensure_models(self.cfg)  # before anything starts: a missing checkpoint is a one-line config error
        if self.cfg.learner.checkpoint_every != cfg.learner.checkpoint_every:
            log.info("learner.checkpoint_every %d -> %d: the learner restarts on failure from its latest checkpoint, "
                     "which must stay within buffer.eta (%d) of its last version", cfg.learner.checkpoint_every,
                     self.cfg.learner.checkpoint_every, self.cfg.buffer.eta)
        self.run_dir = Path(self.cfg.run.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.procs = ProcessGroup(self.run_dir)
        self.metrics = LauncherMetrics(self.procs)
        self._http = MetricsThread(self.metrics.registry, self.cfg.network.host, metrics_port, self.metrics.health)
        self.metrics_port = 0
        self.config_path = self.run_dir / "config.resolved.toml"
        self.vllm = VllmRestarts(self.cfg, self.procs, self._publish)
        self.supervisor = Supervisor(self.procs, self.cfg.launch, self.metrics, self)

    def __enter__(self) -> "LocalStack":
        self._old_sigterm = signal.signal(signal.SIGTERM, _raise_on_sigterm)
        # a launcher started in the background (`nohup ... &`) inherits SIGINT ignored: kill -INT must still stop it
        self._old_sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            self.metrics_port = self._http.start()
            log.info("launcher metrics on port %d", self.metrics_port)
            self._start_vllm()
            self._publish()
            config_path = self.config_path
            role = [sys.executable, "-m", "turnstream.cli"]
            self._start("buffer", [*role, "buffer", "--config", str(config_path)], cpus=self.cfg.buffer.cpus)
            self._start("learner", [*role, "learner", "--config", str(config_path)], cpus=self.cfg.learner.cpus)
            for i in range(self.cfg.actor.num_processes):
                self._start(f"actor-{i}", [*role, "actor", "--config", str(config_path), "--index", str(i)],
                            cpus=self.cfg.actor.cpus)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop in dependency order: actors drain first, then the learner finishes its step, last push and
        checkpoint while the servers still answer, then the buffer syncs its log, then the vLLM servers. Each
        process's peak memory, read before it is signalled, goes to <run_dir>/memory.json."""
        launch = self.cfg.launch
        stages = [(lambda name: role_of(name) == "actor", launch.drain_timeout_s + 10.0),
                  (lambda name: role_of(name) == "learner", launch.stop_timeout_s),
                  (lambda name: role_of(name) == "buffer", launch.stop_timeout_s),
                  (lambda name: role_of(name) == "vllm", VLLM_STOP_TIMEOUT_S)]
        record_peak_memory(self.run_dir, self.procs.stop_all(stages=stages))
        remove_discovery_files(self.cfg)  # Prometheus forgets the run's targets instead of alerting on them
        self._http.stop()
        signal.signal(signal.SIGTERM, self._old_sigterm)
        signal.signal(signal.SIGINT, self._old_sigint)

    def _start(self, name: str, argv: list[str], env: dict | None = None, cpus: list[int] | None = None):
        child = self.procs.start(name, argv, env, cpus)
        self.metrics.started(name)
        return child

    def _publish(self) -> None:
        """Write what the roles and Prometheus read about the run: the resolved config, the scrape targets."""
        tmp = self.config_path.with_name(f".{self.config_path.name}.tmp")
        tmp.write_text(self.cfg.dumps())
        tmp.replace(self.config_path)  # atomic: a role restarting now reads the old file or the new one
        write_scrape_targets(self.cfg, self.metrics_port)

    # ---- restart hooks (launch/supervisor.py) --------------------------------------------------------
    def relaunch(self, child: Child) -> Child:
        if role_of(child.name) == "vllm":
            return self.vllm.relaunch(child)
        if role_of(child.name) == "learner" and "learner.resume=true" not in child.argv:
            # whatever the run started with, a restarted learner goes on from its latest checkpoint
            return self.procs.restart(child, [*child.argv, "--set", "learner.resume=true"])
        return self.procs.restart(child)

    def ready(self, child: Child) -> bool | None:
        return self.vllm.ready(child) if role_of(child.name) == "vllm" else True

    def _start_vllm(self) -> None:
        v, m = self.cfg.vllm, self.cfg.model
        host = self.cfg.network.host
        servers: dict[str, list] = {"urls": [], "frozen_urls": []}
        if not v.urls:
            for i in range(v.num_servers):
                port = v.base_port + i if v.base_port else free_port(host)
                argv, env = vllm_command(m.path, host, port, v, self.cfg.learner.lora)
                url = f"http://{host}:{port}"
                servers["urls"].append((url, self._start(f"vllm-{i}", argv, env, v.cpus)))
        if self.cfg.actor.frozen_agents and not v.frozen_urls:
            # the fixed opponent gets a server of its own, which the learner never pushes to
            port = free_port(host)
            argv, env = vllm_command(m.frozen_path or m.path, host, port, v)
            servers["frozen_urls"].append((f"http://{host}:{port}", self._start("vllm-frozen", argv, env, v.cpus)))
        for field_name, started in servers.items():
            for url, child in started:
                try:
                    wait_healthy(url, v.startup_timeout_s, alive=lambda c=child: c.proc.poll() is None)
                except (RuntimeError, TimeoutError) as exc:
                    raise RoleFailed(f"{exc}; its log: {child.log_path}", tail(child.log_path)) from None
            if started:
                setattr(v, field_name, [url for url, _ in started])
                log.info("vLLM (%s) ready at %s", field_name, ", ".join(getattr(v, field_name)))
        if not v.urls_file:
            # the fleet's membership from now on: add or remove a server by editing this file while running
            v.urls_file = str(self.run_dir / "vllm_urls.txt")
            write_urls_file(Path(v.urls_file), v.urls)

    def check_alive(self) -> None:
        """Restart what failed under the restart policy; RoleFailed for a failure it does not restart."""
        self.supervisor.tick()
