"""deploy/slurm/supervise.sh, the Slurm template's restart policy: restart on failure with a doubling
back-off, give up after MAX_RESTARTS within the window, done on status 0, SIGTERM passed on to the role.
And the rule the multi-node learner templates (Slurm, Kubernetes) rely on to put global rank 0 on their
head node: torchrun's c10d rendezvous numbers the nodes by their sorted --local-addr."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from turnstream.launch.processes import free_port

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


def test_c10d_gives_rank_0_to_the_node_whose_address_sorts_first(tmp_path):
    """Two real torchrun agents (one process each) meet in a c10d rendezvous, as two learner nodes of the
    templates do. The store's host ("localhost", is_host=1) joins first, yet global rank 0 goes to the agent
    whose --local-addr sorts first ("127.0.0.1"): so the templates make the first-sorting name the head."""
    script = tmp_path / "rank.py"
    script.write_text("import os, pathlib\n"
                      "pathlib.Path(os.environ['OUT'], os.environ['NODE']).write_text(os.environ['RANK'])\n")
    endpoint = f"127.0.0.1:{free_port()}"
    procs = []
    try:
        for node, addr, is_host in (("store-host", "localhost", 1), ("other", "127.0.0.1", 0)):
            argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
                    "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", "--rdzv-id=sort-test",
                    f"--rdzv-conf=is_host={is_host},join_timeout=60", f"--local-addr={addr}", "--max-restarts=0",
                    str(script)]
            env = {**os.environ, "OUT": str(tmp_path), "NODE": node, "OMP_NUM_THREADS": "1"}
            procs.append(subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, text=True))
            if is_host:  # the store is up before the other agent joins
                time.sleep(2)
        for proc in procs:
            assert proc.wait(120) == 0, proc.stderr.read()
        assert (tmp_path / "other").read_text() == "0" and (tmp_path / "store-host").read_text() == "1"
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
