"""A real Prometheus server scrapes a running `turnstream up` through the launcher's discovery files, with
the shipped scrape jobs (deploy/prometheus/prometheus.yml) and alert rules (alerts.yml): its own query API
shows every role up, and TurnstreamRoleRestarting firing while an actor is killed again and again.

Needs the prometheus server (scripts/setup.sh installs the package with apt-get); skipped, saying so,
where it is not installed. The run uses the session's vLLM server.
"""
from __future__ import annotations

import json
import shutil
import signal
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.fault.stack import restore_vllm
from tests.fault.test_restart_roles import UpRun, run_config
from tests.helpers import poll_until
from turnstream.launch.processes import ProcessGroup, free_port, tail

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PROMETHEUS = shutil.which("prometheus")
pytestmark = [pytest.mark.e2e, pytest.mark.vllm,
              pytest.mark.skipif(PROMETHEUS is None, reason="the prometheus server is not installed "
                                 "(scripts/setup.sh installs the prometheus package with apt-get where it can)")]


def prometheus_config(targets_dir: Path) -> dict:
    """The shipped config with its discovery globs moved to `targets_dir`, second-scale intervals and the
    shipped alert rules by absolute path."""
    cfg = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    cfg["global"].update(scrape_interval="1s", evaluation_interval="1s")
    cfg["rule_files"] = [str(DEPLOY / "prometheus" / f) for f in cfg["rule_files"]]
    jobs = [j for j in cfg["scrape_configs"] if "file_sd_configs" in j]  # the static examples name no real host
    for job in jobs:
        for sd in job["file_sd_configs"]:
            sd["files"] = [str(targets_dir / Path(f).name) for f in sd["files"]]
            sd["refresh_interval"] = "1s"
    cfg["scrape_configs"] = jobs
    return cfg


class Prometheus:
    def __init__(self, url: str, child):
        self.url, self.child = url, child

    def api(self, path: str, **params) -> dict:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return body["data"]

    def up_by_role(self) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for series in self.api("query", query='up{job="turnstream"}')["result"]:
            out.setdefault(series["metric"]["role"], []).append(float(series["value"][1]))
        return out

    def firing(self, alert: str) -> list[dict]:
        return [a["labels"] for a in self.api("alerts")["alerts"]
                if a["labels"]["alertname"] == alert and a["state"] == "firing"]


@pytest.fixture
def prometheus(tmp_path):
    targets = tmp_path / "targets"
    targets.mkdir()
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(prometheus_config(targets)))
    port = free_port()
    procs = ProcessGroup(tmp_path / "prometheus-run")
    child = procs.start("prometheus", [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                       f"--web.listen-address=127.0.0.1:{port}"])
    server = Prometheus(f"http://127.0.0.1:{port}", child)
    try:
        poll_until(lambda: server.api("status/config"), "Prometheus up", 60, context=lambda: tail(child.log_path),
                   not_yet=(OSError, ValueError))
        yield server, targets
    finally:
        procs.stop_all(timeout_s=10)  # by PID


def test_prometheus_sees_every_role_and_the_restart_alert(tmp_path, tiny_model, vllm_url, prometheus):
    server, targets = prometheus
    config = run_config(tmp_path / "run", tiny_model, f'targets_dir = "{targets}"\n').replace(
        "[actor]\nnum_processes = 2", "[actor]\nnum_processes = 1").replace(
        "[vllm]\n", f'[vllm]\nurls = ["{vllm_url}"]\n')
    up = UpRun(tmp_path, config)
    try:
        up.start()
        up.wait(lambda: up.ledger().steps, "the first learner step", 300)

        def every_role_up():
            roles = server.up_by_role()
            return set(roles) == {"launcher", "buffer", "learner", "actor"} and all(
                v == 1.0 for values in roles.values() for v in values) and roles

        roles = poll_until(every_role_up, "Prometheus to scrape every role", 60,
                           context=lambda: json.dumps(server.api("targets"))[:3000], not_yet=(OSError,))
        assert len(roles["actor"]) == 1
        assert server.firing("TurnstreamRoleRestarting") == []

        for kill in range(3):  # the launcher restarts the actor each time
            old = up.kill9("actor-0")
            up.restarted("actor-0", old)
        firing = poll_until(lambda: server.firing("TurnstreamRoleRestarting"), "the restart alert to fire", 60,
                            context=lambda: json.dumps(server.api("alerts"))[:3000], not_yet=(OSError,))
        assert [(a["role"], a["run"], a["severity"]) for a in firing] == [("actor", "restarts", "page")]
        restarts = server.api("query", query='turnstream_launcher_restarts_total{role="actor"}')["result"]
        assert float(restarts[0]["value"][1]) == 3.0

        assert up.stop(signal.SIGTERM) == 128 + signal.SIGTERM
        assert list(targets.iterdir()) == []  # the run's targets go away with it
    finally:
        up.kill_everything()
        restore_vllm(vllm_url, tiny_model, tmp_path)
