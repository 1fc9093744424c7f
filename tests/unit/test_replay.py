"""`turnstream replay` on a learner run recorded in-process (no vLLM, no buffer): a learner killed after a step it
had not checkpointed restarts from its checkpoint and trains other batches; the replay retrains the lineage and
equals every checkpoint bit for bit, and an A/B under a changed setting trains the same batches differently.
The real asynchronous run with kills: tests/e2e/test_replay_run.py."""
from __future__ import annotations

import json

import torch

from tests.learner_batches import recorded_learner_life, tiny_causal_lm
from turnstream.cli import main as cli_main
from turnstream.core.config import Config, LearnerSection
from turnstream.learner.main import build_trainer
from turnstream.learner.record.reader import open_record
from turnstream.replay.compare import part_of
from turnstream.replay.rebuild import trainer_at


def _run(tmp_path, estimator: str = "spo") -> Config:
    tiny_causal_lm(seed=0).save_pretrained(tmp_path / "base")
    cfg = Config()
    cfg.model.path, cfg.run.run_dir, cfg.run.seed = str(tmp_path / "base"), str(tmp_path / "run"), 3
    cfg.learner = LearnerSection(estimator=estimator, lr=1e-2, max_tokens_per_microbatch=40, device="cpu",
                                 attn_implementation="eager", minibatches=2, checkpoint_every=2, keep_checkpoints=10,
                                 record=True)
    # killed after step 5: checkpoint 4 is its last; then step 5 again, on another batch
    recorded_learner_life(cfg, {v: 100 + v for v in range(1, 6)}, stop_after=5)
    recorded_learner_life(cfg, {v: 200 + v for v in range(5, 8)}, stop_after=7)
    return cfg


def _replay(capsys, *argv) -> tuple[int, list[str], dict]:
    code = cli_main(["replay", *argv])
    lines = capsys.readouterr().out.strip().splitlines()
    return code, lines, json.loads(lines[-1])


def test_a_replay_equals_every_checkpoint_across_a_learner_restart(tmp_path, capsys):
    cfg = _run(tmp_path, estimator="turn_gae")  # a critic too (its initial weights draw from the seed)
    record = open_record(cfg.run_dir)
    assert [s.version for s in record.superseded()] == [5]
    code, lines, summary = _replay(capsys, str(cfg.run_dir))
    assert code == 0, lines
    assert [c["version"] for c in summary["checkpoints"]] == [2, 4, 6]
    assert summary["equal"] and summary["max_abs_diff"] == 0.0 and summary["rng_mismatches"] == 0
    # the process's numpy and python generators differ from version 0 on (nothing seeds them): not a difference
    assert all(c["differing"] == 0 and c["first_difference"] == "" for c in summary["checkpoints"])
    assert (summary["from"], summary["to"], summary["steps"], summary["superseded"]) == (0, 7, 7, 1)
    assert sum(line.startswith("step ") and ": equal" in line for line in lines) == 3
    # step 7 was replayed after the last checkpoint: equal through 6, and step 7 said to be unchecked
    assert summary["compared_through"] == 6 and summary["uncompared"] == [[7, 7]]
    assert lines[-2] == "steps 7..7 replayed, not compared: the run has no checkpoint in them"
    assert summary["stats"]["policy_loss"]["run"] == summary["stats"]["policy_loss"]["replay"]


def test_a_replay_from_a_checkpoint_and_an_ab_on_the_same_batches(tmp_path, capsys):
    cfg = _run(tmp_path)
    code, lines, summary = _replay(capsys, str(cfg.run_dir), "--from-checkpoint",
                                   str(cfg.run_dir / "checkpoints" / "step-000004"), "--to-step", "6")
    assert code == 0 and summary["equal"] and (summary["from"], summary["to"]) == (4, 6)
    assert summary["compared_through"] == 6 and summary["uncompared"] == []
    code, lines, summary = _replay(capsys, str(cfg.run_dir), "--set", "learner.lr=0.05")
    assert code == 0 and not summary["equal"] and summary["max_abs_diff"] > 0
    assert part_of(summary["checkpoints"][-1]["first_difference"]) == "weights"
    assert "differs" in lines[-3] and summary["overrides"] == ["learner.lr=0.05"]


def test_trainer_at_holds_the_runs_state_after_a_step(tmp_path):
    cfg = _run(tmp_path)
    trainer = trainer_at(cfg.run_dir, 6)
    torch.manual_seed(cfg.run.seed)
    run_cfg = cfg.model_copy(deep=True)
    _, at_six, _ = build_trainer(run_cfg, checkpoint=cfg.run_dir / "checkpoints" / "step-000006")
    assert trainer.version == 6
    assert all(torch.equal(p, q) for p, q in zip(trainer._params(), at_six._params()))


def test_a_replay_in_chains_checks_every_checkpoint(tmp_path, capsys):
    cfg = _run(tmp_path)
    code, lines, summary = _replay(capsys, str(cfg.run_dir), "--jobs", "2")
    assert code == 0 and summary["equal"] and summary["chains"] == [[0, 4], [4, 7]]
    assert [c["version"] for c in summary["checkpoints"]] == [2, 4, 6] and summary["steps"] == 7
    assert summary["compared_through"] == 6 and summary["uncompared"] == [[7, 7]]


def test_a_replay_that_reaches_no_checkpoint_compared_nothing_and_exits_3(tmp_path, capsys):
    cfg = _run(tmp_path)
    for ab in ([], ["--set", "learner.lr=0.05"]):  # an A/B with nothing compared cannot say how far it moved
        code, lines, summary = _replay(capsys, str(cfg.run_dir), "--to-step", "1", *ab)
        assert code == 3, lines
        assert (summary["steps"], summary["checkpoints_compared"], summary["compared_through"]) == (1, 0, None)
        assert not summary["equal"] and summary["uncompared"] == [[1, 1]]
        assert lines[-2] == ("nothing compared: the replay of steps 1..1 reached no checkpoint of the run (its "
                             "checkpoints: 2, 4, 6); exit status 3")
