"""`turnstream bench chaos`: its seeded kill schedule and its accounting of the audit trail."""
from __future__ import annotations

import json
import random
from pathlib import Path

from benchmarks.chaos import ROLES, KillSchedule
from benchmarks.chaos_audit import AuditTrail


def test_the_schedule_kills_each_role_once_first_and_is_reproducible():
    picks = []
    for _ in range(2):
        schedule = KillSchedule(random.Random(7), 20.0, 40.0)
        picks.append([schedule.pick(list(ROLES)) for _ in range(12)])
        assert all(20.0 <= schedule.wait_s() <= 40.0 for _ in range(50))
    assert picks[0] == picks[1]  # the seed decides
    assert sorted(picks[0][:len(ROLES)]) == sorted(ROLES)


def test_the_schedule_skips_what_is_not_killable():
    schedule = KillSchedule(random.Random(0), 20.0, 40.0)
    assert schedule.pick([]) is None and schedule.kills == 0
    assert schedule.pick(["buffer"]) == "buffer"
    rest = [schedule.pick([r for r in ROLES if r != "vllm-0"]) for _ in range(3)]
    assert "vllm-0" not in rest and "buffer" not in rest  # the first round goes on with those not killed yet
    assert schedule.pick(list(ROLES)) == "vllm-0"


def _write(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_only_batches_lost_in_a_crash_window_are_excused(tmp_path):
    acks = [{"ack": "ok", "ep": ep, "key": [0, 0, i], "turn": 0, "done": True, "tokens": 3}
            for i, ep in enumerate("abcdefg")]
    _write(tmp_path / "audit" / "buffer.jsonl", [
        {"start": 1}, *acks,
        {"served": ["a"]}, {"served": ["b"]},  # b: served to the first learner, which was killed before training it
        {"served": ["c"]},
        {"served": ["d"]},  # d: the last batch of a killed buffer
        {"start": 2},
        {"served": ["e"]},  # e: served and never trained, no crash explains it
        {"served": ["f"]},
        {"dropped": ["g"], "reason": "abandoned"},
    ])
    _write(tmp_path / "audit" / "learner.jsonl", [
        {"start": 1}, {"version": 1, "episodes": ["a"], "staleness_max": 0},
        {"start": 2}, {"version": 1, "episodes": ["c"], "staleness_max": 0},
        {"version": 2, "episodes": ["f"], "staleness_max": 5},
    ])
    trail = AuditTrail.read(tmp_path)
    assert trail.acked == set("abcdefg") and trail.dropped == {"g"}
    assert trail.lost_in_crash_windows() == {"b", "d"}
    assert set(trail.trained()) == {"a", "c", "f"}
