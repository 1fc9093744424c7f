"""`turnstream bench agent-endpoint --stub` runs every side (direct, plain posts, the openai client) through the
real endpoint without a server and reports each side's figures and ratios."""
from __future__ import annotations

import asyncio

from benchmarks.agent_endpoint import format_table, measure


def test_the_stub_benchmark_measures_every_side(tiny_model):
    out = asyncio.run(measure("stub", str(tiny_model), episodes=4, turns=2, concurrency=2, max_tokens=4, rounds=1))
    assert out["server"] == "stub"
    for side in ("direct", "endpoint", "endpoint_openai"):
        assert out[f"{side}_turns_per_s"] > 0 and out[f"{side}_cpu_ms_per_turn"] > 0
        assert abs(out[f"{side}_tokens_per_s"] - 4 * out[f"{side}_turns_per_s"]) < 1  # 4 tokens every turn (rounded)
    low, high = out["endpoint_openai_ratio_range"]
    assert low <= out["endpoint_openai_ratio"] <= high
    assert "the endpoint, the openai client" in format_table(out)
