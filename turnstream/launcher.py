"""`turnstream up`: every role as a separate local process (vLLM servers, buffer, learner, actors)."""
from __future__ import annotations

import copy
import logging
import signal
import sys
import time
from pathlib import Path

from turnstream.config import Config
from turnstream.processes import ProcessGroup, free_port, tail
from turnstream.vllm_server import vllm_command, wait_healthy

log = logging.getLogger("turnstream.launcher")


class RoleFailed(RuntimeError):
    pass


def _raise_on_sigterm(signum, _frame):
    raise SystemExit(128 + signum)  # unwinds through `finally`, which stops every child


def resolve(cfg: Config) -> Config:
    """Fill in ports left at 0 and absolute paths, so every role reads the same resolved file."""
    cfg = copy.deepcopy(cfg)
    net = cfg.network
    for name in ("buffer_ingest_port", "buffer_serve_port", "learner_pub_port"):
        if getattr(net, name) == 0:
            setattr(net, name, free_port(net.host))
    cfg.run.run_dir = str(Path(cfg.run.run_dir).resolve())
    cfg.model.path = str(Path(cfg.model.path).resolve())
    return cfg


def ensure_model(cfg: Config) -> None:
    path = Path(cfg.model.path)
    if (path / "config.json").exists():
        return
    if not cfg.model.build_tiny_if_missing:
        raise FileNotFoundError(f"model.path {path} holds no checkpoint (config.json)")
    from turnstream.tiny_model import make_tiny_model

    log.info("building the tiny model into %s", path)
    make_tiny_model(path, seed=cfg.model.tiny_seed)


class LocalStack:
    """Context manager: starts everything on enter, stops exactly what it started on exit."""

    def __init__(self, cfg: Config):
        self.cfg = resolve(cfg)
        self.run_dir = Path(self.cfg.run.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.procs = ProcessGroup(self.run_dir)

    def __enter__(self) -> "LocalStack":
        self._old_sigterm = signal.signal(signal.SIGTERM, _raise_on_sigterm)
        try:
            ensure_model(self.cfg)
            self._start_vllm()
            config_path = self.run_dir / "config.resolved.toml"
            config_path.write_text(self.cfg.dumps())
            role = [sys.executable, "-m", "turnstream.cli"]
            self.procs.start("buffer", [*role, "buffer", "--config", str(config_path)])
            self.procs.start("learner", [*role, "learner", "--config", str(config_path)])
            for i in range(self.cfg.actor.num_processes):
                self.procs.start(f"actor-{i}", [*role, "actor", "--config", str(config_path), "--index", str(i)])
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.procs.stop_all()
        signal.signal(signal.SIGTERM, self._old_sigterm)

    def _start_vllm(self) -> None:
        v = self.cfg.vllm
        if v.urls:
            return
        host = self.cfg.network.host
        servers = []
        for i in range(v.num_servers):
            port = v.base_port + i if v.base_port else free_port(host)
            argv, env = vllm_command(self.cfg.model.path, host, port, v)
            servers.append((f"http://{host}:{port}", self.procs.start(f"vllm-{i}", argv, env)))
        for url, child in servers:
            try:
                wait_healthy(url, v.startup_timeout_s, alive=lambda c=child: c.proc.poll() is None)
            except (RuntimeError, TimeoutError) as exc:
                raise RoleFailed(f"{exc}; last log lines:\n{tail(child.log_path)}") from None
        v.urls = [url for url, _ in servers]
        log.info("vLLM ready at %s", ", ".join(v.urls))

    def check_alive(self) -> None:
        for child in self.procs.exited():
            raise RoleFailed(f"{child.name} exited with code {child.proc.returncode}; last log lines:\n"
                             f"{tail(child.log_path)}")


def up(cfg: Config) -> int:
    """Run until the learner finishes max_steps, the time limit passes, or Ctrl-C/SIGTERM."""
    started = time.monotonic()
    with LocalStack(cfg) as stack:
        log.info("all roles running; logs in %s", stack.run_dir / "logs")
        try:
            while time.monotonic() - started < cfg.run.time_limit_s:
                learner = next(c for c in stack.procs.children if c.name == "learner")
                if learner.proc.poll() == 0:
                    return 0
                stack.check_alive()
                time.sleep(1.0)
        except KeyboardInterrupt:
            log.info("interrupted; stopping every role")
    return 0
