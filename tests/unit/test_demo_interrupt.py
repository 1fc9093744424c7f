"""Ctrl-C ends a demo early but not its report: the stack stops, the curve and report are written from what the
run did, and the summary says it was interrupted (exit 130, the shell's code for SIGINT)."""
from __future__ import annotations

import json
from pathlib import Path

from turnstream.core.config import Config
from turnstream.launch import demo


class InterruptedStack:
    """A stack whose first liveness check meets Ctrl-C; it records that it was closed."""
    closed = False

    def __init__(self, cfg: Config):
        self.run_dir = Path(cfg.run.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        InterruptedStack.closed = True
        return False

    def check_alive(self):
        raise KeyboardInterrupt


def test_an_interrupted_demo_stops_its_stack_and_still_reports(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo, "LocalStack", InterruptedStack)
    cfg = Config()
    cfg.run.run_dir = str(tmp_path / "run")
    assert demo.main(cfg) == 130
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["stop_reason"] == "interrupted" and InterruptedStack.closed
    assert Path(summary["report_dir"]).is_dir()
