"""The launcher's restart policy (turnstream/launch/supervisor.py) on real child processes, with a test clock; the
staged stop order; the [launch] table; the refusal of a used run directory without --resume."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from turnstream.core.config import Config, load_config
from turnstream.core.configtools import ConfigError
from turnstream.launch.metrics import LauncherMetrics
from turnstream.launch.processes import ProcessGroup
from turnstream.launch.stack import restart_checkpoint_every
from turnstream.launch.supervisor import RoleFailed, Supervisor
from turnstream.launch.up import check_run_dir

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class RestartSame:
    """The launcher's hooks for roles that need nothing before serving: start the same command again."""

    def __init__(self, procs: ProcessGroup):
        self.procs = procs

    def relaunch(self, child):
        return self.procs.restart(child)

    def ready(self, child):
        return True


@pytest.fixture
def procs(tmp_path):
    group = ProcessGroup(tmp_path)
    yield group
    group.stop_all(timeout_s=5)  # by PID, whatever a test left running


def _supervisor(procs, clock, **launch):
    cfg = load_config(None, [f"launch.{k}={v}" for k, v in launch.items()])
    metrics = LauncherMetrics(procs)
    return Supervisor(procs, cfg.launch, metrics, RestartSame(procs), clock=clock), metrics


def _kill9(child) -> None:
    os.kill(child.proc.pid, signal.SIGKILL)
    child.proc.wait()


def _restarts(metrics, role: str) -> float:
    return metrics.registry.get_sample_value("turnstream_launcher_restarts_total", {"role": role})


def test_a_killed_role_restarts_after_a_doubling_backoff_until_the_cap(procs):
    clock = Clock()
    sup, metrics = _supervisor(procs, clock, backoff_initial_s=2.0, backoff_max_s=5.0, max_restarts=3,
                               restart_window_s=100.0)
    procs.start("actor-0", SLEEPER)
    first_pid = procs.children[0].proc.pid
    waits = []
    for attempt in range(3):
        _kill9(procs.children[0])
        sup.tick()  # noticed: the restart is scheduled, not run yet
        assert procs.children[0].proc.poll() is not None
        killed_at = clock.now
        while procs.children[0].proc.poll() is not None:
            clock.now += 0.5
            sup.tick()
        waits.append(clock.now - killed_at)
        assert procs.children[0].incarnation == attempt + 2
    assert waits == [2.0, 4.0, 5.0]  # 2, doubled, capped at backoff_max_s
    assert procs.children[0].name == "actor-0" and procs.children[0].proc.pid != first_pid
    assert _restarts(metrics, "actor") == 3.0
    log = procs.children[0].log_path.read_text()
    assert "incarnation 4 of actor-0" in log  # one log file across incarnations
    _kill9(procs.children[0])
    with pytest.raises(RoleFailed) as failed:  # a 4th failure within the window: the run stops
        sup.tick()
    message = str(failed.value)
    assert "\n" not in message and "actor-0 was killed by SIGKILL after 3 restarts" in message
    assert "launch.max_restarts = 3" in message


def test_restarts_older_than_the_window_no_longer_count(procs):
    clock = Clock()
    sup, _ = _supervisor(procs, clock, backoff_initial_s=1.0, max_restarts=1, restart_window_s=10.0)
    procs.start("buffer", SLEEPER)
    for _ in range(3):  # each failure comes after the previous restart left the window
        _kill9(procs.children[0])
        sup.tick()
        clock.now += 1.0
        sup.tick()
        assert procs.children[0].proc.poll() is None
        clock.now += 11.0


def test_policy_never_stops_the_run_with_one_line_naming_the_signal(procs):
    clock = Clock()
    sup, metrics = _supervisor(procs, clock, **{"restart_roles.actor": '"never"'})
    procs.start("learner", SLEEPER)
    procs.start("actor-0", SLEEPER)
    _kill9(procs.children[1])
    with pytest.raises(RoleFailed) as failed:
        sup.tick()
    assert str(failed.value).startswith("actor-0 was killed by SIGKILL (launch restart policy for actor: never)")
    assert _restarts(metrics, "actor") == 0.0


def test_a_role_exiting_by_itself_ends_the_run_but_a_finished_learner_is_the_caller_s(procs):
    clock = Clock()
    sup, _ = _supervisor(procs, clock)
    procs.start("learner", [sys.executable, "-c", "pass"]).proc.wait()  # max_steps reached
    sup.tick()
    procs.start("buffer", [sys.executable, "-c", "import sys; sys.exit(0)"]).proc.wait()
    with pytest.raises(RoleFailed, match="buffer exited with status 0"):
        sup.tick()


def test_the_cli_prints_one_line_and_exits_1_for_a_failed_role(tmp_path, monkeypatch):
    """RoleFailed leaves the CLI as the role's log tail and one last line, never a traceback."""
    import turnstream.launch.up as launcher
    from turnstream.cli import main

    def failing_up(cfg, resume=False):
        raise RoleFailed("actor-0 was killed by SIGKILL (launch restart policy for actor: never); its log: x.log",
                         "last words of actor-0")

    monkeypatch.setattr(launcher, "up", failing_up)
    config = tmp_path / "c.toml"
    config.write_text(f'[run]\nrun_dir = "{tmp_path / "run"}"\n')
    import io
    from contextlib import redirect_stderr

    err = io.StringIO()
    with redirect_stderr(err):
        assert main(["up", "--config", str(config)]) == 1
    lines = err.getvalue().strip().splitlines()
    assert lines[-1].startswith("turnstream: run stopped: actor-0 was killed by SIGKILL")
    assert "Traceback" not in err.getvalue() and "last words of actor-0" in lines


def test_stop_stages_run_in_order(procs, tmp_path):
    """Actors stop before the learner, the learner before the buffer and the vLLM servers."""
    order = tmp_path / "order"
    script = ("import signal, sys, time\n"
              "def bye(*_):\n"
              f"    open({str(order)!r}, 'a').write(sys.argv[1] + '\\n'); sys.exit(0)\n"
              "signal.signal(signal.SIGTERM, bye)\n"
              "print('ready', flush=True)\n"
              "time.sleep(60)\n")
    for name in ("vllm-0", "buffer", "learner", "actor-0", "actor-1"):
        procs.start(name, [sys.executable, "-c", script, name])
    deadline = time.monotonic() + 30
    while not all("ready" in c.log_path.read_text() for c in procs.children):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    role = lambda name: name.split("-")[0]  # noqa: E731
    procs.stop_all(stages=[(lambda n, r=r: role(n) == r, 10.0) for r in ("actor", "learner", "buffer", "vllm")])
    stopped = order.read_text().split()
    assert sorted(stopped[:2]) == ["actor-0", "actor-1"]
    assert stopped[2:] == ["learner", "buffer", "vllm-0"]


def test_launch_table_backoff_and_bounds():
    launch = Config().launch
    assert launch.restart == "on-failure"
    assert [launch.backoff_s(n) for n in range(7)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    with pytest.raises(ConfigError, match="launch.backoff_max_s: must be >= backoff_initial_s"):
        load_config(None, ["launch.backoff_initial_s=10.0", "launch.backoff_max_s=5.0"])
    with pytest.raises(ConfigError, match="launch.restart_roles"):
        load_config(None, ['launch.restart_roles.trainer="never"'])


def test_a_used_run_dir_is_refused_without_resume(tmp_path):
    cfg = Config()
    cfg.run.run_dir = str(tmp_path / "run")
    check_run_dir(cfg, resume=False)  # a new directory: fine
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"run.run_dir: .* already holds a run \(checkpoints\); add --resume"):
        check_run_dir(cfg, resume=False)
    cfg.learner.resume = False
    check_run_dir(cfg, resume=True)
    assert cfg.learner.resume  # --resume continues from the latest checkpoint


def test_up_on_a_used_run_dir_is_one_line_and_non_zero(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "buffer-wal").mkdir(parents=True)
    config = tmp_path / "c.toml"
    config.write_text(f'[run]\nrun_dir = "{run_dir}"\n')
    proc = subprocess.run([sys.executable, "-m", "turnstream.cli", "up", "--config", str(config)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "already holds a run (buffer-wal); add --resume" in lines[0], proc.stderr


def test_a_restarting_learner_checkpoints_within_the_staleness_bound():
    cfg = Config()  # checkpoint_every 0, eta 2, max_staleness 4
    assert restart_checkpoint_every(cfg) == 2  # launch.learner_checkpoint_every (10), held to eta
    cfg.learner.checkpoint_every, cfg.buffer.eta, cfg.buffer.max_staleness = 3, 4, 8
    assert restart_checkpoint_every(cfg) == 3
    cfg.buffer.eta = cfg.buffer.max_staleness = 0  # the synchronous baseline: every step
    assert restart_checkpoint_every(cfg) == 1
