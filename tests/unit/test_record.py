"""The learner's record (learner/record/): what the writer keeps is what the reader gives back, and which step
counts for a version when a learner restarted or could not write a step."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.learner_batches import synthetic_batch
from turnstream.core.config import Config
from turnstream.learner.device import set_torch_threads
from turnstream.learner.record.format import incarnation_dir, lost_file, step_file
from turnstream.learner.record.reader import RecordError, open_record
from turnstream.learner.record.writer import StepRecorder, generator_state


def _config(tmp_path) -> Config:
    cfg = Config()
    cfg.run.run_dir = str(tmp_path / "run")
    cfg.run.seed = 7
    cfg.learner.lr = 1e-3
    return cfg


def _record(recorder: StepRecorder, versions, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    for v in versions:
        recorder.write_step(v, synthetic_batch(4, seed=v, learner_version=v - 1), generator_state(gen), 0.5)
        torch.randperm(10, generator=gen)


def _checkpoint(cfg: Config, version: int) -> None:
    d = cfg.run_dir / "checkpoints" / f"step-{version:06d}"
    d.mkdir(parents=True)
    (d / "trainer.pt").write_bytes(b"")


def test_a_recorded_step_reads_back_as_served(tmp_path):
    cfg = _config(tmp_path)
    recorder = StepRecorder.start(cfg, 0, world=2, resumed_from=None)
    gen = torch.Generator().manual_seed(3)
    state = generator_state(gen)
    batch = synthetic_batch(6, seed=1, learner_version=0)
    written = recorder.write_step(1, batch, state, 0.25)
    assert written.bytes > 0
    record = open_record(cfg.run_dir)
    step = record.step(1)
    assert (step.version, step.learner_version, step.request_id, step.step_s) == (1, 0, batch.request_id, 0.25)
    got = step.batch
    for name in ("tokens", "action_mask", "behav_logprobs", "versions", "episode_offsets", "turn_rewards"):
        assert np.array_equal(getattr(got, name), getattr(batch, name)), name
    assert (got.episode_ids, got.prompt_keys, got.returns) == (batch.episode_ids, batch.prompt_keys, batch.returns)
    restored = torch.Generator()
    restored.set_state(torch.frombuffer(bytearray(step.generator_state), dtype=torch.uint8))
    assert torch.equal(torch.randperm(50, generator=restored), torch.randperm(50, generator=gen))
    inc = record.first()
    assert (inc.start_version, inc.world, inc.seed, inc.resumed_from) == (0, 2, 7, "")
    assert inc.config().learner.lr == 1e-3
    assert inc.config(["learner.lr=0.5"]).learner.lr == 0.5
    assert not list(cfg.run_dir.joinpath("record").rglob(".*.tmp"))  # no temporary file left behind


def test_a_restarted_learner_supersedes_the_steps_after_its_checkpoint(tmp_path):
    cfg = _config(tmp_path)
    _record(StepRecorder.start(cfg, 0, 1, None), [1, 2, 3, 4, 5])  # killed after step 5, checkpoint at 4
    _checkpoint(cfg, 4)
    _record(StepRecorder.start(cfg, 4, 1, cfg.run_dir / "checkpoints" / "step-000004"), [5, 6, 7])
    record = open_record(cfg.run_dir)
    assert record.versions == [1, 2, 3, 4, 5, 6, 7] and record.lost() == []
    assert [s.incarnation.index for s in record.steps()] == [0, 0, 0, 0, 1, 1, 1]
    assert [(s.version, s.incarnation.index) for s in record.superseded()] == [(5, 0)]
    assert record.incarnations[1].resumed_from.endswith("step-000004")
    assert [s.version for s in record.steps(first=3, last=5)] == [3, 4, 5]


def test_a_step_that_could_not_be_written_is_lost_not_invented(tmp_path):
    cfg = _config(tmp_path)
    recorder = StepRecorder.start(cfg, 0, 1, None)
    _record(recorder, [1, 2])
    (incarnation_dir(cfg.run_dir, 0) / step_file(3)).mkdir()  # the step's file cannot be written
    written = recorder.write_step(3, synthetic_batch(2, learner_version=2), b"", 0.1)
    assert written.bytes == 0 and (incarnation_dir(cfg.run_dir, 0) / lost_file(3)).is_file()
    (incarnation_dir(cfg.run_dir, 0) / step_file(3)).rmdir()
    _record(recorder, [4])
    # a step whose file and marker both went missing (a gap), and a checkpoint past the last recorded step
    (incarnation_dir(cfg.run_dir, 0) / step_file(2)).unlink()
    _checkpoint(cfg, 6)
    record = open_record(cfg.run_dir)
    assert record.versions == [1, 2, 3, 4, 5, 6]
    assert record.lost() == [2, 3, 5, 6]
    with pytest.raises(RecordError, match="step 3 is lost"):
        record.step(3).batch
    with pytest.raises(RecordError, match="no step 9"):
        record.step(9)


def test_a_learner_started_afresh_supersedes_everything(tmp_path):
    cfg = _config(tmp_path)
    _record(StepRecorder.start(cfg, 0, 1, None), [1, 2, 3])
    _record(StepRecorder.start(cfg, 0, 1, None), [1, 2])  # learner.resume = false: version 0 again
    record = open_record(cfg.run_dir)
    assert [s.incarnation.index for s in record.steps()] == [1, 1]
    assert [s.version for s in record.superseded()] == [1, 2, 3]


def test_a_run_without_a_record_says_so(tmp_path):
    with pytest.raises(RecordError, match="learner.record = true"):
        open_record(tmp_path)


def test_the_record_names_the_thread_count_torch_chose(tmp_path):
    """learner.torch_threads = 0 leaves the count to torch, and the recorded config names the count used: a replay
    on a machine of another size must sum in the same order."""
    cfg = _config(tmp_path)
    cfg.learner.torch_threads = 0
    before = torch.get_num_threads()
    try:
        assert set_torch_threads(cfg.learner) == before == cfg.learner.torch_threads
        StepRecorder.start(cfg, 0, world=1, resumed_from=None)
        assert open_record(cfg.run_dir).first().config().learner.torch_threads == before
        cfg.learner.torch_threads = 1
        set_torch_threads(cfg.learner)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
