"""deploy/slurm/supervise.sh, the Slurm template's restart policy: restart on failure with a doubling
back-off, give up after MAX_RESTARTS within the window, done on status 0, SIGTERM passed on to the role."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

SUPERVISE = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "supervise.sh"


def _env(**values) -> dict:
    return {**os.environ, "BACKOFF_INITIAL_S": "0.1", "BACKOFF_MAX_S": "0.3", **{k: str(v) for k, v in values.items()}}


def _role(tmp_path: Path, fails: int) -> list[str]:
    """A role that fails `fails` times (status 3), then exits 0; each start appends a line to `starts`."""
    starts = tmp_path / "starts"
    script = (f'echo start >> "{starts}"; n=$(wc -l < "{starts}"); '
              f'if [ "$n" -le {fails} ]; then exit 3; fi; exit 0')
    return ["bash", "-c", script]


def test_a_failing_role_is_restarted_until_it_succeeds(tmp_path):
    proc = subprocess.run([str(SUPERVISE), *_role(tmp_path, fails=3)], env=_env(MAX_RESTARTS=5),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "starts").read_text().split() == ["start"] * 4
    delays = [line.rsplit(" in ", 1)[1] for line in proc.stderr.splitlines() if "restart" in line]
    assert delays == ["0.1s", "0.2s", "0.3s"]  # doubling, capped at BACKOFF_MAX_S


def test_it_gives_up_after_max_restarts_with_the_role_s_status(tmp_path):
    proc = subprocess.run([str(SUPERVISE), *_role(tmp_path, fails=100)], env=_env(MAX_RESTARTS=2),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert len((tmp_path / "starts").read_text().split()) == 3  # the first start and 2 restarts
    assert "after 2 restarts within 600s; giving up" in proc.stderr


def test_sigterm_reaches_the_role_and_is_not_restarted(tmp_path):
    marker = tmp_path / "got-term"
    role = ["bash", "-c", f'trap \'echo term > "{marker}"; exit 0\' TERM; echo up > "{tmp_path / "up"}"; '
            'while true; do sleep 0.1; done']
    proc = subprocess.Popen([str(SUPERVISE), *role], env=_env(), start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "up").exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0  # the role's own status after its graceful stop
        assert marker.read_text().strip() == "term"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
