"""deploy/prometheus and deploy/grafana: they parse, have what alerting and dashboards need, and every
turnstream metric they query exists in the catalogue (docs/metrics.md)."""
from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path

import pytest
import yaml

from turnstream.core.config import Config
from turnstream.launch.scrape_targets import discovery_files, write_scrape_targets
from turnstream.launch.stack import resolve
from tests.catalogue_queries import all_series_names

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
METRIC_RE = re.compile(r"\bturnstream_[a-z0-9_]+\b")
ROLES = {"launcher", "buffer", "learner", "actor"}


def _load(rel: str):
    path = DEPLOY / rel
    return json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(path.read_text())


def _alerts() -> list[dict]:
    return [rule for group in _load("prometheus/alerts.yml")["groups"] for rule in group["rules"]]


def _dashboard_exprs() -> list[str]:
    return [t["expr"] for p in _load("grafana/turnstream-overview.json")["panels"] for t in p.get("targets", [])]


def _balanced(expr: str) -> bool:
    depth = 0
    for ch in expr:
        depth += {"(": 1, ")": -1, "{": 1, "}": -1, "[": 1, "]": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


def test_alert_rules_have_the_required_fields():
    rules = _alerts()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    for r in rules:
        assert r["expr"].strip() and _balanced(r["expr"]), r["alert"]
        assert r["labels"]["severity"] in ("page", "warn"), r["alert"]
        assert r["annotations"]["summary"], r["alert"]
        assert re.fullmatch(r"\d+[smh]", r["for"]), r["alert"]


def test_the_issue_s_alerts_exist():
    names = {r["alert"] for r in _alerts()}
    assert {"TurnstreamLearnerStalled", "TurnstreamStaleDropsRising", "TurnstreamActorsBelowTarget",
            "TurnstreamBufferInsertBlockedHigh",
            "TurnstreamWeightSyncSlow", "TurnstreamWeightSyncFailing"} <= names


@pytest.mark.parametrize("source", ["alerts", "dashboard"])
def test_every_referenced_metric_is_in_the_catalogue(source):
    exprs = [r["expr"] for r in _alerts()] if source == "alerts" else _dashboard_exprs()
    referenced = {m for e in exprs for m in METRIC_RE.findall(e)}
    assert referenced, source
    assert referenced - all_series_names() == set()


def test_dashboard_structure():
    dash = _load("grafana/turnstream-overview.json")
    assert dash["uid"] and dash["title"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    rows = {p["title"] for p in dash["panels"] if p["type"] == "row"}
    assert rows == {"Throughput", "Staleness", "Buffer", "Learner", "Weight sync and timing"}
    for p in dash["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        if p["type"] != "row":
            assert p["targets"] and all(t["expr"] and _balanced(t["expr"]) for t in p["targets"]), p["title"]
            refs = [t["refId"] for t in p["targets"]]
            assert len(refs) == len(set(refs)), p["title"]
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "run"} <= variables
    assert all("$run" in e for e in _dashboard_exprs())  # every panel follows the run selector


def test_prometheus_config_discovers_the_launcher_s_files(tmp_path):
    prom = _load("prometheus/prometheus.yml")
    for rule_file in prom["rule_files"]:
        assert (DEPLOY / "prometheus" / rule_file).is_file()
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    assert {"turnstream", "vllm", "turnstream-static", "vllm-static"} <= set(jobs)

    # A run under runs/ as `turnstream up` lays it out must match the discovery globs.
    # (written under tmp_path, never into the checkout)
    cfg = Config()
    run_dir = tmp_path / "runs" / "some-run"
    cfg.run.run_dir = str(run_dir)
    turnstream_file = write_scrape_targets(resolve(cfg), 1234)
    for job, produced in discovery_files(resolve(cfg)).items():
        assert produced.is_file(), produced
        (pattern,) = jobs[job]["file_sd_configs"][0]["files"]
        resolved = (DEPLOY / "prometheus" / pattern).resolve()
        relative_pattern = str(resolved.relative_to(ROOT))
        # as Prometheus globs: a wildcard never crosses a "/" (fnmatch's would)
        path_parts, pattern_parts = produced.relative_to(tmp_path).parts, Path(relative_pattern).parts
        assert len(path_parts) == len(pattern_parts) and all(
            fnmatch.fnmatch(p, q) for p, q in zip(path_parts, pattern_parts)), (job, relative_pattern)
    for group in json.loads(turnstream_file.read_text()):  # the format file_sd reads
        assert set(group) == {"targets", "labels"} and group["labels"]["role"] in ROLES

    for static in jobs["turnstream-static"]["static_configs"]:
        assert static["labels"]["role"] in ROLES


def test_kubernetes_and_compose_scrape_configs_label_roles():
    for rel in ("prometheus/kubernetes.yml", "compose/prometheus.yml"):
        prom = _load(rel)
        text = (DEPLOY / rel).read_text()
        assert prom["scrape_configs"], rel
        assert "role" in text and "run" in text, rel


def test_grafana_provisioning_points_at_the_dashboard():
    ds = _load("grafana/provisioning/datasources/prometheus.yml")
    assert ds["datasources"][0]["type"] == "prometheus"
    providers = _load("grafana/provisioning/dashboards/turnstream.yml")["providers"]
    assert providers[0]["options"]["path"] == "/var/lib/grafana/dashboards"
