"""Each role's peak memory at the stop (turnstream/launch/peak_memory.py): read over the process tree of a child the
launcher started, just before it is signalled; memory.json and its log line; the report's plot of it."""
from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

from tests.helpers import process_group_gone
from turnstream.launch.peak_memory import record_peak_memory
from turnstream.launch.processes import ProcessGroup
from turnstream.reports.figures import REPORT_FILES, memory_figure, write_report
from turnstream.reports.plotting import pyplot
from turnstream.reports.run_log import MEMORY_FILE, read_peak_memory

# Each holds its allocation written (so resident, not lazily mapped zero pages), says so, then sleeps.
GRANDCHILD = """
import pathlib, sys, time
held = bytearray(b"\\x01") * (100 << 20)
pathlib.Path(sys.argv[1], "grandchild").write_text(str(__import__("os").getpid()))
time.sleep(120)
"""
CHILD = """
import pathlib, subprocess, sys, time
held = bytearray(b"\\x01") * (200 << 20)
subprocess.Popen([sys.executable, sys.argv[2], sys.argv[1]])
pathlib.Path(sys.argv[1], "child").touch()
time.sleep(120)
"""
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def _wait_for(paths: list[Path], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"not ready: {[str(p) for p in paths if not p.exists()]}"
        time.sleep(0.05)


def test_stop_reads_each_childs_peak_summed_over_its_process_tree(tmp_path):
    (tmp_path / "child.py").write_text(CHILD)
    (tmp_path / "grandchild.py").write_text(GRANDCHILD)
    ready = tmp_path / "ready"
    ready.mkdir()
    procs = ProcessGroup(tmp_path)
    child = procs.start("actor-0", [sys.executable, str(tmp_path / "child.py"), str(ready),
                                    str(tmp_path / "grandchild.py")])
    try:
        _wait_for([ready / "child", ready / "grandchild"])
        grandchild_pid = int((ready / "grandchild").read_text())
    finally:
        peaks = procs.stop_all(timeout_s=5)
    # the child alone holds 200 MiB and an interpreter: only the grandchild's 100 MiB brings the sum past 300
    assert peaks["actor-0"] >= 300.0, peaks
    assert child.proc.returncode is not None and process_group_gone(child.proc.pid)
    try:
        Path(f"/proc/{grandchild_pid}/status").read_text()
        gone = False
    except FileNotFoundError:
        gone = True
    assert gone, "the grandchild outlived the stop"


def test_a_child_that_exited_before_the_stop_is_not_measured(tmp_path):
    procs = ProcessGroup(tmp_path)
    procs.start("learner", [sys.executable, "-c", "pass"]).proc.wait()
    procs.start("buffer", SLEEPER)
    stages = [(lambda name: name == "learner", 5.0), (lambda name: name == "buffer", 5.0)]
    peaks = procs.stop_all(timeout_s=5, stages=stages)
    assert peaks["learner"] is None
    assert peaks["buffer"] is not None and peaks["buffer"] > 1.0  # an interpreter's few MiB at least


def test_record_writes_memory_json_and_logs_one_line(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="turnstream.launcher"):
        record_peak_memory(tmp_path, {"vllm-0": 812.25, "learner": None, "actor-0": 96.4})
    assert json.loads((tmp_path / MEMORY_FILE).read_text()) == {"vllm-0": 812.25, "learner": None, "actor-0": 96.4}
    assert read_peak_memory(tmp_path) == {"vllm-0": 812.25, "learner": None, "actor-0": 96.4}
    lines = [r.getMessage() for r in caplog.records if "peak memory" in r.getMessage()]
    assert len(lines) == 1
    assert "vllm-0 812 MiB" in lines[0] and "actor-0 96 MiB" in lines[0]
    assert "not measured (exited before the stop): learner" in lines[0]


def test_a_run_dir_that_cannot_be_written_costs_only_a_warning(tmp_path, caplog):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with caplog.at_level(logging.WARNING, logger="turnstream.launcher"):
        record_peak_memory(not_a_dir, {"buffer": 50.0})
    assert any(MEMORY_FILE in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_read_peak_memory_of_a_run_without_the_file_or_with_a_torn_one(tmp_path):
    assert read_peak_memory(tmp_path) == {}
    (tmp_path / MEMORY_FILE).write_text('{"buffer": 5')
    assert read_peak_memory(tmp_path) == {}


def test_report_plots_each_roles_peak_and_names_the_unmeasured(tmp_path):
    plt = pyplot()
    fig = memory_figure(plt, {"vllm-0": 812.0, "learner": None, "buffer": 64.0})
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["vllm-0", "learner", "buffer"]
    assert [p.get_height() for p in ax.patches] == [812.0, 0.0, 64.0]
    assert any("not measured" in t.get_text() for t in ax.texts)
    plt.close(fig)
    record_peak_memory(tmp_path, {"buffer": 64.0})
    paths = write_report(tmp_path)
    assert "memory.png" in REPORT_FILES and (tmp_path / "report" / "memory.png") in paths
