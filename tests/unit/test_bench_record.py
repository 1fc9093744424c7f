"""bench record's replay figures: a real `turnstream replay` of a recorded learner run, its seconds against the
learner's and against the run end to end (the server's start plus the launcher's seconds to the last step)."""
from __future__ import annotations

from tests.learner_batches import recorded_learner_life, tiny_causal_lm
from benchmarks.record import replay
from turnstream.core.config import Config, LearnerSection
from turnstream.learner.record.reader import open_record


def test_the_replay_is_set_against_the_learner_and_the_run_end_to_end(tmp_path):
    tiny_causal_lm(seed=0).save_pretrained(tmp_path / "base")
    cfg = Config()
    cfg.model.path, cfg.run.run_dir = str(tmp_path / "base"), str(tmp_path / "run")
    cfg.learner = LearnerSection(max_tokens_per_microbatch=40, device="cpu", attn_implementation="eager",
                                 checkpoint_every=2, record=True)
    recorded_learner_life(cfg, {v: 100 + v for v in range(1, 5)}, stop_after=4)
    record = open_record(cfg.run_dir)
    launched_at = record.first().started - 3.0  # the launcher started the roles 3 s before the learner began

    out = replay({"run_dir": str(cfg.run_dir), "launched_at": launched_at}, jobs=1, server_start_s=10.0)
    assert out["equal"] and out["steps"] == 4 and out["speedup"] > 0  # the replay's own figure, passed on
    assert out["run_end_to_end_s"] == round(10.0 + record.step(4).time - launched_at, 2)
    assert out["run_end_to_end_s"] > out["run_s"] + 13.0 - 0.01
    assert out["speedup_end_to_end"] == round(out["run_end_to_end_s"] / out["replay_s"], 2)

    given = replay({"run_dir": str(cfg.run_dir), "launched_at": launched_at}, jobs=1, server_start_s=None)
    assert given["run_end_to_end_s"] is None and given["speedup_end_to_end"] is None  # a server given by --url
