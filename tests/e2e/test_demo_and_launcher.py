"""Every role as a separate process: a short training run learns, and no process outlives the launcher."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import launcher_running, process_group_gone, stop_launcher

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


def test_short_training_run_improves_success(tmp_path, tiny_model):
    run_dir = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "turnstream.cli", "demo", "--set", f'run.run_dir="{run_dir}"',
         "--set", f'model.path="{tiny_model}"', "--set", "run.time_limit_s=400"],
        capture_output=True, text=True, timeout=600,
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("success_start", "success_end", "episodes", "learner_steps", "weight_version",
                "max_staleness_seen", "wall_s", "run_dir"):
        assert key in result, key
    assert result["success_end"] >= result["success_start"] + 0.3, result
    assert result["weight_version"] == result["learner_steps"] > 0
    assert result["max_staleness_seen"] <= 4  # buffer.max_staleness default
    # eta 2 (asynchronous): a version's push runs while the next step trains (learner.overlap_push auto)
    steps = [json.loads(line) for line in (run_dir / "learner.jsonl").read_text().splitlines()]
    assert [s["version"] for s in steps] == list(range(1, len(steps) + 1))
    push_ended = {s["version"]: s["push_started"] + s["push_s"] for s in steps}
    assert any(s["step_started"] < push_ended[s["version"] - 1] for s in steps[1:]), "no push overlapped a step"
    assert Path(result["learning_curve"]).stat().st_size > 0
    pids = json.loads((run_dir / "pids.json").read_text())
    assert set(pids) >= {"vllm-0", "buffer", "learner", "actor-0"}
    assert all(process_group_gone(pid) for pid in pids.values()), pids
    # every role still ran when the demo stopped it, so each one's peak was read (a vLLM server holds its model)
    peaks = json.loads((run_dir / "memory.json").read_text())
    assert result["peak_memory_mib"] == peaks and set(peaks) == set(pids), peaks
    assert all(mib is not None and mib > 10.0 for mib in peaks.values()), peaks


def test_launcher_stops_every_role_on_ctrl_c(tmp_path, tiny_model):
    """SIGINT, as Ctrl-C sends it; SIGTERM's stop of every process is tests/fault/test_restart_roles.py's last
    test (and its drain and checkpoint tests/fault/test_restart_resume.py's), on a run with restarted roles."""
    run_dir = tmp_path / "up"
    config = tmp_path / "up.toml"
    config.write_text(f'[run]\nrun_dir = "{run_dir}"\ntime_limit_s = 300.0\n\n[model]\npath = "{tiny_model}"\n')
    with launcher_running(config, run_dir) as launcher:
        stop_launcher(launcher, run_dir, signal.SIGINT)
