"""Experiment trackers (learner/trackers.py): each step's stats and the pooled evaluation rounds, read back
from the TensorBoard event files with TensorBoard's own reader and from the W&B offline run's transaction log
with W&B's own record definitions."""
from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

from turnstream.core.config import Config, ConfigError
from turnstream.learner.trackers import EvalRounds, open_trackers, step_scalars


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of the event files under log_dir: tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def wandb_records(run_dir: Path):
    """The protobuf records of a W&B offline run's transaction log (run-*.wandb): a 7-byte file header, then
    LevelDB-style 32 KiB blocks of (crc32, length, type) fragments."""
    from wandb.proto import wandb_internal_pb2 as pb

    [path] = run_dir.glob("run-*.wandb")
    data, pos, block, payload = path.read_bytes(), 7, 32768, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        payload += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last fragment of one
            record = pb.Record()
            record.ParseFromString(payload)
            payload = b""
            yield record


def wandb_history(log_dir: Path) -> list[dict]:
    """The logged rows of the one offline run under log_dir."""
    [run_dir] = (log_dir / "wandb").glob("offline-run-*")
    return [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            for record in wandb_records(run_dir) if record.WhichOneof("record_type") == "history"]


def step_stats(version: int) -> dict:
    """A learner step's stats as learner/serve.py logs them (the shape of a learner.jsonl line)."""
    return {"policy_loss": -0.01 * version, "entropy": 0.5, "episodes": 8, "return_mean": 0.25 * version,
            "staleness_max": 1, "staleness_hist": {"0": 5, "1": 3}, "version": version, "step_s": 0.5,
            "push_s": float("nan"), "wait_s": 0.1, "step_started": 1.7e9, "push_started": 1.7e9, "time": 1.7e9,
            "wall_s": 3.0 * version}


def config(tmp_path: Path, trackers: list[str], actors: int = 2) -> Config:
    cfg = Config()
    cfg.run.run_dir = str(tmp_path / "run-a")
    cfg.logging.trackers = trackers
    cfg.actor.num_processes = actors
    return cfg


def eval_line(run_dir: Path, version: int, success: float, episodes: int, actor: str) -> None:
    with (run_dir / "eval.jsonl").open("a") as f:
        f.write(json.dumps({"version": version, "success": success, "episodes": episodes, "time": 0.0,
                            "actor": actor}) + "\n")


def test_step_scalars_are_the_numbers_of_a_step_without_its_timestamps():
    values = step_scalars(step_stats(3))
    assert values["learner/return_mean"] == 0.75 and values["learner/episodes"] == 8.0
    assert values["learner/staleness_hist/1"] == 3.0
    assert not {"learner/time", "learner/step_started", "learner/push_started", "learner/version"} & set(values)


def test_an_evaluation_round_is_reported_once_every_actor_wrote_its_part(tmp_path):
    path = tmp_path / "eval.jsonl"
    rounds = EvalRounds(path, actors=2)
    assert rounds.complete() == []  # no file yet
    eval_line(tmp_path, 0, 1.0, 2, "actor-0")
    assert rounds.complete() == []  # actor-1's part is still to come
    eval_line(tmp_path, 0, 0.25, 4, "actor-1")
    assert rounds.complete() == [(0, 0.5, 6)]  # episode-weighted: (2 + 1) / 6
    eval_line(tmp_path, 4, 1.0, 2, "actor-1")
    with path.open("a") as f:
        f.write('{"version": 8, "succ')  # a line still being appended is not read yet
    assert rounds.complete() == []
    with path.open("a") as f:
        f.write('ess": 0.0, "episodes": 2, "time": 0, "actor": "actor-0"}\n')
    assert rounds.complete() == [(4, 1.0, 2)]  # a later version closes a round an actor never finished
    assert rounds.remaining() == [(8, 0.0, 2)]  # the end of the run closes the rest


def test_steps_and_evaluations_reach_tensorboard_and_wandb_offline(tmp_path, monkeypatch):
    """TensorBoard's event files are read back; for W&B, the run and the rows as W&B took them. Its offline
    transaction log, which wandb-core writes in its own time, was twice read back here short of records that
    W&B had taken (once the run record, once every history row) on a loaded CI machine; the learner
    process's test (tests/integration/test_trackers_learner.py) reads the rows back from it."""
    cfg = config(tmp_path, ["tensorboard", "wandb"])
    run_dir = Path(cfg.run.run_dir)
    trackers = open_trackers(cfg)
    run = trackers.sinks["wandb"].run
    assert run.project == "turnstream" and run.name == "run-a"
    assert run.config["logging"]["trackers"] == ["tensorboard", "wandb"]  # the run's config
    rows, log_row = [], run.log
    monkeypatch.setattr(run, "log", lambda row, **kw: (rows.append(dict(row)), log_row(row, **kw))[1])
    eval_line(run_dir, 0, 0.5, 4, "actor-0")
    eval_line(run_dir, 0, 0.0, 4, "actor-1")
    for version in (1, 2, 3):
        trackers.step(step_stats(version))
    eval_line(run_dir, 2, 1.0, 4, "actor-0")  # actor-1's part never comes: written at the end
    trackers.close()

    log_dir = run_dir / "trackers"
    scalars = tensorboard_scalars(log_dir / "tensorboard")
    assert scalars["learner/return_mean"] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert [step for step, _ in scalars["learner/push_s"]] == [1, 2, 3]  # NaN (a failed push) is kept
    assert scalars["learner/staleness_hist/0"] == [(1, 5.0), (2, 5.0), (3, 5.0)]
    assert scalars["eval/success"] == [(0, 0.25), (2, 1.0)]
    assert scalars["eval/episodes"] == [(0, 8.0), (2, 4.0)]

    assert list((log_dir / "wandb").glob("offline-run-*/run-*.wandb"))  # the offline run's transaction log
    learner_rows = [r for r in rows if "learner/version" in r]
    assert [(r["learner/version"], r["learner/return_mean"]) for r in learner_rows] == [(1, 0.25), (2, 0.5),
                                                                                       (3, 0.75)]
    assert learner_rows[0]["learner/staleness_hist/1"] == 3.0 and "learner/time" not in learner_rows[0]
    evals = [(r["eval/version"], r["eval/success"], r["eval/episodes"]) for r in rows if "eval/version" in r]
    assert evals == [(0, 0.25, 8.0), (2, 1.0, 4.0)]


def test_one_tracker_alone_and_a_log_dir_of_its_own(tmp_path):
    cfg = config(tmp_path, ["tensorboard"])
    cfg.logging.dir = str(tmp_path / "tb-elsewhere")
    trackers = open_trackers(cfg)
    trackers.step(step_stats(1))
    trackers.close()
    assert tensorboard_scalars(tmp_path / "tb-elsewhere" / "tensorboard")["learner/entropy"] == [(1, 0.5)]
    assert not (tmp_path / "tb-elsewhere" / "wandb").exists()


def test_no_trackers_writes_nothing(tmp_path):
    trackers = open_trackers(config(tmp_path, []))
    trackers.step(step_stats(1))
    trackers.close()
    assert not (tmp_path / "run-a" / "trackers").exists()


def test_a_missing_tracker_package_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what `import wandb` meets where it is not installed
    with pytest.raises(ConfigError, match=r"^logging.trackers: wandb needs the wandb package .*integrations"):
        open_trackers(config(tmp_path, ["wandb"]))


def test_a_failing_tracker_is_switched_off_and_the_others_go_on(tmp_path):
    trackers = open_trackers(config(tmp_path, ["tensorboard"]))

    class Broken:
        def write(self, values, axis, version):
            raise OSError("disk full")

        def close(self):
            pass

    trackers.sinks = {"broken": Broken(), **trackers.sinks}
    trackers.step(step_stats(1))  # no exception: training goes on
    trackers.step(step_stats(2))
    assert list(trackers.sinks) == ["tensorboard"]
    trackers.close()
    assert tensorboard_scalars(tmp_path / "run-a" / "trackers" / "tensorboard")["learner/entropy"] == [(1, 0.5),
                                                                                                      (2, 0.5)]
