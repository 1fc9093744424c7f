"""`turnstream bench` runs the source checkout's benchmarks/, found beside the package's source or in the current
directory; without one it says so in one line and exits 1 (an installed wheel holds no benchmarks)."""
from __future__ import annotations

from pathlib import Path

import pytest

from turnstream.cli import bench, main
from turnstream.core.configtools import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_bench_outside_a_checkout_says_so_in_one_line_and_exits_1(tmp_path, monkeypatch, capsys):
    """An installed wheel: the package's folder has no benchmarks/ beside it, nor has the current directory."""
    monkeypatch.setattr(bench, "PACKAGE_DIR", tmp_path / "site-packages" / "turnstream")
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "dataplane", "--help"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [bench.NOT_IN_A_CHECKOUT]
    assert "benchmarks/ is not here" in err and "source checkout" in err


def test_bench_finds_the_checkout_in_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "PACKAGE_DIR", tmp_path / "site-packages" / "turnstream")
    monkeypatch.chdir(ROOT)
    assert bench.find_checkout(bench.checkout_places()) == ROOT
    with pytest.raises(ConfigError, match="bench: no benchmark named 'nope'"):
        bench.run_benchmark("nope", [])


def test_bench_finds_the_checkout_beside_the_package_source(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert bench.find_checkout(bench.checkout_places()) == ROOT
    assert bench.module_name("async") == "benchmarks.async_vs_sync"
    assert bench.module_name("lora-push") == "benchmarks.lora_push"
