"""`turnstream report` plots from a synthetic learner.jsonl, and the demo's progress display."""
from __future__ import annotations

import io
import json
import logging

from turnstream.reports.figures import REPORT_FILES, main, plot_learning_curve, write_report
from turnstream.reports.progress import Progress
from turnstream.reports.run_log import read_steps, rolling_success, staleness_totals, throughput


def _steps(n: int = 6) -> list[dict]:
    t0 = 1_000.0
    out = []
    for i in range(1, n + 1):
        out.append({"version": i, "episodes": 128, "tokens": 1000 * i, "return_mean": 0.1 * i,
                    "policy_loss": 0.01 / i, "approx_kl": 0.001 * i, "entropy": 0.7 - 0.05 * i,
                    "clip_fraction": 0.0, "grad_norm": 1.0 / i, "staleness_hist": {str(i % 3 + 1): 300, "0": 10},
                    "staleness_mean": i % 3, "staleness_max": i % 3, "step_s": 1.5, "wait_s": 0.1,
                    "push_s": float("nan") if i == 3 else 0.2, "wall_s": 2.0 * i, "time": t0 + 2.0 * i})
    return out


def _run_dir(tmp_path, steps):
    run = tmp_path / "run"
    run.mkdir()
    # json.dumps writes NaN for a failed push, exactly as the learner does
    (run / "learner.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps) + '{"partial": ')
    return run


def test_read_steps_stops_at_a_partial_line_and_rolling_success(tmp_path):
    run = _run_dir(tmp_path, _steps())
    steps = read_steps(run)
    assert len(steps) == 6
    assert rolling_success(steps, 256) == (0.6 * 128 + 0.5 * 128) / 256
    assert read_steps(tmp_path / "missing") == []


def test_staleness_totals_and_throughput():
    steps = _steps(3)
    assert staleness_totals(steps) == {0: 30, 1: 300, 2: 300, 3: 300}
    rates = throughput(steps)
    assert [r[0] for r in rates] == [2.0, 4.0, 6.0]
    assert rates[1][1] == 2000 / 2.0 and rates[1][2] == 128 / 2.0


def test_write_report_makes_every_png(tmp_path):
    run = _run_dir(tmp_path, _steps())
    paths = write_report(run)
    assert [p.name for p in paths] == list(REPORT_FILES)
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    curve = plot_learning_curve(run, out=tmp_path / "c.png", t0=990.0)
    assert curve.stat().st_size > 0


def test_write_report_on_an_empty_run(tmp_path):
    run = tmp_path / "empty"
    run.mkdir()
    assert len(write_report(run, out_dir=tmp_path / "out")) == len(REPORT_FILES)


def test_report_main(tmp_path, capsys):
    run = _run_dir(tmp_path, _steps())
    assert main(run) == 0
    printed = capsys.readouterr().out.split()
    assert printed[0].endswith("learning_curve.png") and len(printed) == 1 + len(REPORT_FILES)
    assert main(tmp_path / "nothing") == 1


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_rewrites_one_line_on_a_tty():
    out = _Tty()
    p = Progress(256, stream=out)
    p.update([], 1.0)
    p.update(_steps(2), 5.0)
    p.close()
    text = out.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n") and text.count("\n") == 1
    assert "step 2" in text and "rolling 0.150" in text and "tok/s" in text and "staleness max 2" in text


def test_progress_logs_periodically_without_a_tty(caplog):
    out = io.StringIO()
    p = Progress(256, stream=out, interval_s=10.0)
    with caplog.at_level(logging.INFO, logger="turnstream.reports.progress"):
        for t in range(0, 30):
            p.update(_steps(2), float(t))
        p.update(_steps(2), 30.5, force=True)
    p.close()
    assert out.getvalue() == ""
    assert len(caplog.records) == 4  # t = 0, 10, 20, and the forced final line
