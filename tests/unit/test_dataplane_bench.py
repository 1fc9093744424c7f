"""benchmarks/dataplane.py runs end to end on tiny counts (real buffer processes, real
sockets) and print one JSON line last with the ratios, the absolute figures and the CPU each side spent per
chunk."""
from __future__ import annotations

import json

from benchmarks import dataplane


def test_bench_dataplane_smoke(capsys):
    assert dataplane.main(["--small-count", "200", "--large-count", "20", "--large-bytes", str(256 * 1024),
                           "--repeats", "2"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    out = json.loads(lines[-1])
    assert out["ratio_small"] > 0 and out["ratio_large"] > 0
    assert out["ack_only_small"] > 0 and out["ack_only_large"] > 0
    assert out["ack_delay_gain_small"] > 0 and out["ack_delay_gain_large"] > 0
    for size in ("small", "large"):  # the figures are medians of the repeats, which are all there
        runs = out[size]["runs"]
        assert len(runs) == 2 and out[size]["repeats"] == 2
        assert out[size]["ours_chunks_per_s"] == (runs[0]["ours_chunks_per_s"] + runs[1]["ours_chunks_per_s"]) / 2
    ratios = [r["ours_chunks_per_s"] / r["raw_chunks_per_s"] for r in out["large"]["runs"]]
    assert out["ratio_large"] == round(sum(ratios) / 2, 3)
    assert out["ratio_large_range"] == [round(min(ratios), 3), round(max(ratios), 3)]
    for size in ("small", "large"):
        for row in ("raw", "ack_only", "ours", "ours_ack0", "ours_wal"):
            assert out[size][f"{row}_chunks_per_s"] > 0, (size, row)
            # CPU time comes from /proc in clock ticks (10 ms), too coarse at these counts to compare figures
            for side in ("sender", "receiver", "receiver_main"):
                assert out[size][f"{row}_{side}_cpu_us_per_chunk"] >= 0, (size, row, side)
