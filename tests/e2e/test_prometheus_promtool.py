"""Every Prometheus file in deploy/ passes Prometheus's own checker (promtool), and the alert rules' unit
tests (deploy/prometheus/alerts.test.yml) pass. Needs promtool (scripts/setup.sh installs the `prometheus`
package with apt-get); skipped, saying so, where it is not installed."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (scripts/setup.sh installs the "
                                "prometheus package with apt-get where it can)")


def _yaml_files() -> dict[str, list[Path]]:
    """deploy/'s Prometheus files by kind: scrape configs, rule files, rule unit tests."""
    kinds: dict[str, list[Path]] = {"config": [], "rules": [], "tests": []}
    for path in sorted(DEPLOY.rglob("*.y*ml")):
        docs = list(yaml.safe_load_all(path.read_text()))  # Kubernetes manifests hold several
        doc = docs[0] if len(docs) == 1 else None
        if not isinstance(doc, dict):
            continue
        if "scrape_configs" in doc:
            kinds["config"].append(path)
        elif "tests" in doc and "rule_files" in doc:
            kinds["tests"].append(path)
        elif "groups" in doc and all("rules" in g for g in doc["groups"]):
            kinds["rules"].append(path)
    return kinds


FILES = _yaml_files()


def _promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)


def test_deploy_holds_each_kind_of_prometheus_file():
    names = {kind: {p.relative_to(DEPLOY).as_posix() for p in paths} for kind, paths in FILES.items()}
    assert {"prometheus/prometheus.yml", "prometheus/kubernetes.yml", "compose/prometheus.yml"} <= names["config"]
    assert names["rules"] == {"prometheus/alerts.yml"}
    assert names["tests"] == {"prometheus/alerts.test.yml"}


@pytest.mark.parametrize("path", FILES["config"], ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_scrape_configs_pass_promtool(path: Path, tmp_path):
    proc = _promtool("check", "config", "--syntax-only", str(path))
    if proc.returncode != 0 and "field kubernetes_sd_configs not found" in proc.stdout + proc.stderr:
        # Debian's build of Prometheus leaves Kubernetes discovery out: check everything else in the file (the
        # relabelling, which carries the `role` and `run` labels) with that one block as static targets
        doc = yaml.safe_load(path.read_text())
        for job in doc["scrape_configs"]:
            if job.pop("kubernetes_sd_configs", None) is not None:
                job["static_configs"] = [{"targets": ["127.0.0.1:9"]}]
        path = tmp_path / path.name
        path.write_text(yaml.safe_dump(doc))
        proc = _promtool("check", "config", "--syntax-only", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_local_config_passes_the_full_check_with_its_rule_files():
    proc = _promtool("check", "config", str(DEPLOY / "prometheus" / "prometheus.yml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 1 rule files found" in proc.stdout


@pytest.mark.parametrize("path", FILES["rules"], ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_alert_rules_pass_promtool(path: Path):
    proc = _promtool("check", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("path", FILES["tests"], ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_alert_rule_unit_tests_pass(path: Path):
    proc = _promtool("test", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
