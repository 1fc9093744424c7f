"""`turnstream up` restarts a failed role by itself (launch.restart = on-failure), one role at a time, each
killed by PID with SIGKILL: an actor (new epoch), the buffer (replays its write-ahead log), the learner
(resumes from its latest checkpoint) and the vLLM server (back on a new port, brought to the current
weights before it serves). After each restart the run goes on, and the audit trail shows no chunk ingested
twice, no episode trained twice and no token beyond the staleness bound. A SIGTERM then stops everything.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.fault.ledger import Ledger
from tests.helpers import http_json, poll_until, process_group_gone, scrape
from turnstream.core.config import Config, load_config
from turnstream.launch.processes import tail

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


def run_config(run_dir: Path, model: Path, extra: str = "") -> str:
    """A small run for fault tests: two actors, small batches, checkpoints every 2 steps, quick back-off."""
    return (f'[run]\nname = "restarts"\nrun_dir = "{run_dir}"\ntime_limit_s = 1200.0\n\n'
            f'[model]\npath = "{model}"\n\n'
            '[vllm]\nhealth_interval_s = 0.5\n\n'
            '[actor]\nnum_processes = 2\nconcurrent_episodes = 8\nresend_after_s = 2.0\nrequest_timeout_s = 3.0\n\n'
            '[env]\nstep_timeout_s = 0.5\n\n'  # a turn (a request's deadline, a step) fits in the episode timeout
            '[buffer]\nbatch_episodes = 16\neta = 2\nmax_staleness = 4\nmax_items = 64\n'
            'episode_timeout_s = 4.0\nactor_timeout_s = 3.0\n\n'
            '[learner]\ncheckpoint_every = 2\nkeep_checkpoints = 3\n\n'
            f'[launch]\nbackoff_initial_s = 0.5\ndrain_timeout_s = 10.0\n{extra}')


class UpRun:
    """`turnstream up` as a subprocess in a session of its own, read through its run directory."""

    def __init__(self, tmp: Path, config_text: str):
        self.tmp = tmp
        self.config = tmp / "run.toml"
        self.config.write_text(config_text)
        self.run_dir = Path(load_config(self.config).run.run_dir)
        self.launcher: subprocess.Popen | None = None
        self.seen_pids: set[int] = set()  # every role process any launcher here started
        self.starts = 0

    # ---- the launcher ---------------------------------------------------------------------------
    def start(self, *args: str) -> "UpRun":
        self.starts += 1
        out = (self.tmp / f"launcher-{self.starts}.out").open("wb")
        err = (self.tmp / f"launcher-{self.starts}.err").open("wb")
        self.launcher = subprocess.Popen(
            [sys.executable, "-m", "turnstream.cli", "up", "--config", str(self.config), *args], stdout=out,
            stderr=err, start_new_session=True, env={**os.environ, "TURNSTREAM_AUDIT": "1"})
        return self

    def stderr(self) -> str:
        return (self.tmp / f"launcher-{self.starts}.err").read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 180) -> int:
        """Signal the launcher, wait for it, and check that no process it ever started outlives it."""
        self.pids()
        self.launcher.send_signal(sig)
        code = self.launcher.wait(timeout_s)
        self.check_no_orphans()
        return code

    def check_no_orphans(self) -> None:
        self.pids()
        assert all(process_group_gone(pid) for pid in self.seen_pids), self.seen_pids

    def kill_everything(self) -> None:
        """The test's own cleanup, by PID: the launcher's session, then every role process group seen."""
        if self.launcher is not None and self.launcher.poll() is None:
            os.killpg(self.launcher.pid, signal.SIGKILL)
            self.launcher.wait()
        self.pids()
        for pid in self.seen_pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    # ---- what the run directory says ----------------------------------------------------------
    def pids(self) -> dict[str, int]:
        try:
            pids = json.loads((self.run_dir / "pids.json").read_text())
        except (OSError, ValueError):
            return {}
        self.seen_pids.update(pids.values())
        return pids

    def cfg(self) -> Config:
        return load_config(self.run_dir / "config.resolved.toml")

    def port(self, role: str) -> int:
        if role == "launcher":
            targets = json.loads((self.run_dir / "prometheus" / "turnstream.json").read_text())
            return int(next(t for t in targets if t["labels"]["role"] == "launcher")["targets"][0].split(":")[1])
        cfg = self.cfg()
        if role.startswith("actor-"):
            return cfg.actor.metrics_port + int(role.split("-")[1])
        return getattr(cfg, role).metrics_port

    def metrics(self, role: str) -> dict[str, float]:
        return scrape(f"http://127.0.0.1:{self.port(role)}/metrics")

    def version(self) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port('learner')}/healthz", timeout=5) as resp:
            return int(json.loads(resp.read())["version"])

    def acked(self, actor: str) -> float:
        return self.metrics(actor).get('turnstream_actor_acks_total{status="ok"}', 0.0)

    def log(self, name: str) -> str:
        return (self.run_dir / "logs" / f"{name}.log").read_text(errors="replace")

    def ledger(self) -> Ledger:
        return Ledger.read(self.run_dir)

    # ---- waiting ------------------------------------------------------------------------------
    def wait(self, predicate, what: str, timeout_s: float = 240.0):
        def alive() -> None:
            assert self.launcher.poll() is None, f"the launcher exited:\n{self.stderr()[-3000:]}"

        def context() -> str:
            logs = "\n".join(f"--- {name}\n{tail(self.run_dir / 'logs' / f'{name}.log', 10)}" for name in self.pids())
            return f"{logs}\n--- launcher\n{self.stderr()[-2000:]}"

        return poll_until(predicate, what, timeout_s, context=context, check=alive, not_yet=(OSError, ValueError),
                          interval_s=0.5)

    def progress(self, actors=("actor-0", "actor-1"), steps: int = 2) -> None:
        """Training goes on: the learner takes `steps` more steps and every actor gets new acks."""
        v0 = self.wait(lambda: (self.version(),), "the learner's /healthz")[0]
        acks = {a: self.wait(lambda a=a: (self.acked(a),), f"{a}'s /metrics")[0] for a in actors}
        self.wait(lambda: self.version() >= v0 + steps, f"learner version {v0 + steps}")
        for a in actors:
            self.wait(lambda a=a: self.acked(a) > acks[a], f"new acks for {a}")

    def kill9(self, name: str) -> int:
        """SIGKILL one role process by its PID; returns the PID."""
        pid = self.pids()[name]
        os.kill(pid, signal.SIGKILL)
        return pid

    def restarted(self, name: str, old_pid: int) -> int:
        """Wait for the launcher to start `name` again; returns the new PID."""
        return self.wait(lambda: self.pids().get(name) not in (None, old_pid) and self.pids()[name],
                         f"{name} restarted")

    def check_ledger(self) -> Ledger:
        led = self.ledger()
        assert led.double_ingested() == [], "a chunk key was acked ok twice"
        assert led.trained_twice() == [], "an episode was trained twice"
        assert led.malformed_trained() == [], "a trained episode is not exactly its acked chunks"
        bound = self.cfg().buffer.max_staleness
        assert all(rec["staleness_max"] <= bound for _, rec in led.steps), "a trained token beyond max_staleness"
        return led


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model):
    tmp = tmp_path_factory.mktemp("restarts")
    up = UpRun(tmp, run_config(tmp / "run", tiny_model)).start()
    try:
        up.wait(lambda: up.ledger().steps, "the first learner step", 400)
        yield up
    finally:
        up.kill_everything()


def _restarts(run: UpRun, role: str) -> float:
    return run.metrics("launcher")[f'turnstream_launcher_restarts_total{{role="{role}"}}']


def test_a_killed_actor_is_restarted_with_a_new_epoch(run: UpRun):
    old = run.kill9("actor-0")
    run.restarted("actor-0", old)
    epochs = run.wait(lambda: (e := re.findall(r"actor-0 \(epoch (\d+)\)", run.log("actor-0"))) and len(e) == 2 and e,
                      "the restarted actor's epoch line")
    assert epochs[0] != epochs[1]
    assert "incarnation 2 of actor-0" in run.log("actor-0")
    run.progress()
    assert _restarts(run, "actor") == 1.0
    run.check_ledger()


def test_a_killed_buffer_is_restarted_and_replays_its_log(run: UpRun):
    run.wait(lambda: run.metrics("buffer")['turnstream_buffer_items{state="running"}'] > 0, "episodes in flight")
    old = run.kill9("buffer")
    run.restarted("buffer", old)
    replayed = run.wait(lambda: run.metrics("buffer")["turnstream_buffer_wal_replayed_records_total"],
                        "the restarted buffer's replay")
    assert replayed > 0
    run.progress()
    assert _restarts(run, "buffer") == 1.0
    run.check_ledger()


def test_a_killed_learner_is_restarted_from_its_latest_checkpoint(run: UpRun):
    ckpts = run.run_dir / "checkpoints"
    run.wait(lambda: list(ckpts.glob("step-*")), "a checkpoint")
    old = run.kill9("learner")
    latest = max(int(p.name.split("-")[1]) for p in ckpts.glob("step-*"))
    run.restarted("learner", old)
    resumed = run.wait(lambda: re.findall(r"resumed from \S+ at version (\d+)", run.log("learner")),
                       "the resume log line")
    assert int(resumed[-1]) == latest  # the newest checkpoint, not version 0
    run.progress()
    assert _restarts(run, "learner") == 1.0
    run.check_ledger()


def test_a_killed_vllm_server_comes_back_at_the_current_weights_before_it_serves(run: UpRun):
    urls_file = run.run_dir / "vllm_urls.txt"
    old_url = [u for u in urls_file.read_text().split() if u.startswith("http")][0]
    version_before = run.version()
    assert version_before > 0
    old = run.kill9("vllm-0")
    run.restarted("vllm-0", old)
    new_url = run.wait(lambda: [u for u in urls_file.read_text().split() if u.startswith("http") and u != old_url],
                       "the restarted server in the URL file", 400)[0]
    # announced only paused (requests wait) or already pushed to: never serving its start-up weights
    paused = http_json(f"{new_url}/is_paused")["is_paused"]
    served = http_json(f"{new_url}/weight_info")["weight_version"]
    assert paused or (served.isdigit() and int(served) >= version_before), (paused, served)
    run.wait(lambda: not http_json(f"{new_url}/is_paused")["is_paused"], "the learner's push to resume it")
    served = http_json(f"{new_url}/weight_info")["weight_version"]
    assert served.isdigit() and int(served) >= version_before
    assert run.cfg().vllm.urls == [new_url]  # a role restarted from now on reads the new server too
    run.progress()
    assert _restarts(run, "vllm") == 1.0
    run.check_ledger()


def test_sigterm_stops_the_restarted_run_and_every_process_it_started(run: UpRun):
    assert run.stop(signal.SIGTERM) == 128 + signal.SIGTERM
    run.check_ledger()
