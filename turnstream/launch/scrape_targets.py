"""Prometheus file-based discovery for a local run: which /metrics endpoints it has, with `role` and `run`.

Two copies of each file. `<run_dir>/prometheus/turnstream.json` and `vllm.json` stay with the run.
Prometheus's file discovery allows a wildcard only in a path's last element, so the launcher also writes
`<targets dir>/<run dir name>-turnstream.json` and `-vllm.json` (the targets dir is launch.targets_dir, by
default the run directory's parent, `runs/` for runs under it), which deploy/prometheus/prometheus.yml
reads; those are removed when the launcher stops, so a finished run's targets disappear instead of
alerting as down.
"""
from __future__ import annotations

import json
from pathlib import Path

from turnstream.core.config import Config


def scrape_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "") else host  # a wildcard bind is reached via loopback here


def discovery_files(cfg: Config) -> dict[str, Path]:
    """{"turnstream": path, "vllm": path} of the copies Prometheus reads."""
    run_dir = Path(cfg.run.run_dir)
    where = Path(cfg.launch.targets_dir) if cfg.launch.targets_dir else run_dir.parent
    return {job: where / f"{run_dir.name}-{job}.json" for job in ("turnstream", "vllm")}


def write_scrape_targets(cfg: Config, launcher_port: int) -> Path:
    """Write the discovery files; returns the run directory's turnstream.json.

    turnstream.json lists every turnstream /metrics endpoint with a `role` label; vllm.json the vLLM servers,
    whose metrics follow vLLM's own naming and are scraped as a separate job.
    """
    host = scrape_host(cfg.network.host)
    labels = {"run": cfg.run.name}
    groups = [
        {"targets": [f"{host}:{launcher_port}"], "labels": {**labels, "role": "launcher"}},
        {"targets": [f"{host}:{cfg.buffer.metrics_port}"], "labels": {**labels, "role": "buffer"}},
        {"targets": [f"{host}:{cfg.learner.metrics_port}"], "labels": {**labels, "role": "learner"}},
        {"targets": [f"{host}:{cfg.actor.metrics_port + i}" for i in range(cfg.actor.num_processes)],
         "labels": {**labels, "role": "actor"}},
    ]
    vllm = [{"targets": [url.split("://", 1)[-1].rstrip("/") for url in cfg.vllm.urls],
             "labels": {**labels, "role": "vllm"}}]
    out = Path(cfg.run.run_dir) / "prometheus"
    shared = discovery_files(cfg)
    for job, content in (("turnstream", groups), ("vllm", vllm)):
        for path in (out / f"{job}.json", shared[job]):
            _write_atomic(path, json.dumps(content, indent=1) + "\n")
    return out / "turnstream.json"


def remove_discovery_files(cfg: Config) -> None:
    for path in discovery_files(cfg).values():
        path.unlink(missing_ok=True)


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)  # atomic: Prometheus may read the file at any moment
