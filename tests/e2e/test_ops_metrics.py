"""A running local stack: every role's /metrics and /healthz answer, and every metric name and label set
follows the naming rules and is in the catalogue (docs/metrics.md)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
import urllib.request

import pytest

from tests.helpers import process_group_gone

from turnstream.metrics_catalogue import KNOWN_DEVIATIONS, lint_exposition, roles_with_build_info

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
    launcher = subprocess.Popen([sys.executable, "-m", "turnstream.cli", "up", "--config", str(config)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        log = run_dir / "learner.jsonl"
        while not (log.exists() and log.read_text().strip()):  # one learner step: every role has done work
            assert launcher.poll() is None, "launcher exited early"
            assert time.monotonic() < deadline, "no learner step within the deadline"
            time.sleep(1)

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

        pids = json.loads((run_dir / "pids.json").read_text())
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) is not None
        assert all(process_group_gone(pid) for pid in pids.values()), pids
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
