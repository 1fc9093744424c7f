"""A running local stack: every role's /metrics and /healthz answer, and every metric name and label set
follows the naming rules and is in the catalogue (docs/metrics.md)."""
from __future__ import annotations

import json
import tomllib
import urllib.request

import pytest

from tests.helpers import launcher_running, stop_launcher

from tests.catalogue_queries import roles_with_build_info
from turnstream.reference.metrics import KNOWN_DEVIATIONS, lint_exposition

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200, url
        return resp.read().decode()


def test_every_role_serves_lint_clean_metrics(tmp_path, tiny_model):
    run_dir = tmp_path / "up"
    config = tmp_path / "up.toml"
    config.write_text(f'[run]\nrun_dir = "{run_dir}"\ntime_limit_s = 300.0\n\n[model]\npath = "{tiny_model}"\n'
                      "\n[actor]\nnum_processes = 2\nconcurrent_episodes = 16\n")
    with launcher_running(config, run_dir) as launcher:  # one learner step: every role has done work
        resolved = tomllib.loads((run_dir / "config.resolved.toml").read_text())
        groups = json.loads((run_dir / "prometheus" / "turnstream.json").read_text())
        targets = {(g["labels"]["role"], t) for g in groups for t in g["targets"]}
        ports = {t.rsplit(":", 1)[1] for _, t in targets}
        assert {str(resolved["buffer"]["metrics_port"]), str(resolved["learner"]["metrics_port"]),
                str(resolved["actor"]["metrics_port"]), str(resolved["actor"]["metrics_port"] + 1)} <= ports
        assert sorted(role for role, _ in targets) == ["actor", "actor", "buffer", "launcher", "learner"]

        with_build_info = roles_with_build_info()
        assert "launcher" in with_build_info
        for role, target in sorted(targets):
            body = _get(f"http://{target}/metrics")
            problems = {k: v for k, v in lint_exposition(body, role=role).items() if k not in KNOWN_DEVIATIONS}
            assert problems == {}, (role, target)
            assert "turnstream_" in body, (role, target)
            if role in with_build_info:  # the launcher today; each role once its metrics class registers it
                assert "turnstream_build_info{" in body, (role, target)
            assert json.loads(_get(f"http://{target}/healthz"))["status"] == "ok"

        launcher_target = next(t for role, t in targets if role == "launcher")
        body = _get(f"http://{launcher_target}/metrics")
        for role, count in (("vllm", 1), ("buffer", 1), ("learner", 1), ("actor", 2)):
            assert f'turnstream_launcher_processes_running{{role="{role}"}} {count}.0' in body, role

        stop_launcher(launcher, run_dir)
