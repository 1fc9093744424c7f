"""Stopping and continuing a whole run: a graceful stop (SIGTERM to the launcher) followed by
`turnstream up --resume` loses nothing that was acked; a used run directory is refused without --resume;
a role killed under restart policy `never` ends the run with one line, not a traceback.

The runs use the session's vLLM server (vllm.urls), so the launcher starts none.
"""
from __future__ import annotations

import re
import signal

import pytest

from tests.fault.stack import restore_vllm
from tests.fault.test_restart_roles import UpRun, run_config
from benchmarks.chaos_audit import held_in_log

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


@pytest.fixture
def session_server(vllm_url, tiny_model, tmp_path):
    yield vllm_url
    restore_vllm(vllm_url, tiny_model, tmp_path)  # the learners pushed into it: original weights, version 0


def _on_server(config_text: str, url: str) -> str:
    return config_text.replace("[vllm]\n", f'[vllm]\nurls = ["{url}"]\n')


def test_graceful_stop_then_resume_loses_nothing_acked(tmp_path, tiny_model, session_server):
    up = UpRun(tmp_path, _on_server(run_config(tmp_path / "run", tiny_model), session_server))
    try:
        up.start()
        up.wait(lambda: len(up.ledger().steps) >= 3, "three learner steps", 300)
        assert up.stop(signal.SIGTERM) == 128 + signal.SIGTERM
        first_version = max(rec["version"] for _, rec in up.ledger().steps)
        learner_log = up.log("learner")
        # the learner stopped while the servers still answered: its last push went through
        assert "push of version" not in learner_log, learner_log[-2000:]
        assert f"checkpoint of version {first_version} on stop" in learner_log or \
            (up.run_dir / "checkpoints" / f"step-{first_version:06d}").is_dir()
        for actor in ("actor-0", "actor-1"):
            assert re.search(r"drained in [\d.]+ s: every chunk acked|drain timed out", up.log(actor)), actor
        assert "write-ahead log synced" in up.log("buffer")

        up.start()  # the same run directory without --resume: refused, nothing started
        assert up.launcher.wait(120) == 2
        lines = up.stderr().strip().splitlines()
        assert len(lines) == 1 and "already holds a run" in lines[0] and "--resume" in lines[0], lines

        up.start("--resume")
        resumed = up.wait(lambda: re.findall(r"resumed from \S+ at version (\d+)", up.log("learner")),
                          "the resumed learner")
        assert int(resumed[-1]) == first_version  # every step of the first run kept
        up.wait(lambda: max(rec["version"] for _, rec in up.ledger().steps) >= first_version + 2,
                "two steps after the resume", 300)
        assert up.stop(signal.SIGTERM) == 128 + signal.SIGTERM
        assert "push of version" not in up.log("learner")

        led = up.check_ledger()
        trained = set(led.trained_counts())
        assert [r for r in led.untrained_served(trained)] == [], "a served batch was never trained"
        led.check_accounted(held_in_log(up.run_dir / "buffer-wal" / "wal.log", up.cfg().buffer, tmp_path))
        versions = [rec["version"] for _, rec in led.steps]
        assert versions == list(range(1, len(versions) + 1)), "a version trained twice or skipped across the resume"
    finally:
        up.kill_everything()


def test_a_role_killed_under_policy_never_ends_the_run_with_one_line(tmp_path, tiny_model, session_server):
    config = run_config(tmp_path / "run", tiny_model, 'restart_roles = {actor = "never"}\n')
    up = UpRun(tmp_path, _on_server(config, session_server))
    try:
        up.start()
        up.wait(lambda: up.ledger().steps, "the first learner step", 300)
        up.kill9("actor-0")
        assert up.launcher.wait(180) == 1
        up.check_no_orphans()
        err = up.stderr()
        assert "Traceback" not in err
        last = err.strip().splitlines()[-1]
        assert last.startswith("turnstream: run stopped: actor-0 was killed by SIGKILL (launch restart policy for "
                               "actor: never)"), last
    finally:
        up.kill_everything()
