"""`turnstream replay` of a learner run recorded on a CUDA device: how close the replay comes to the run's own
checkpoints, with torch's default kernels and with deterministic algorithms on (`--deterministic`).

The CPU replay is bit for bit (tests/unit/test_replay.py); on a GPU some kernels (atomic adds in backward,
split-K matmuls) may sum in another order from one call to the next, so the figure here is the largest difference
over every compared leaf. The figures go to the JUnit report (`record_property`), which benchmarks/gpu_check.sh keeps.

Marked `gpu` and skipped (reported as skipped, with the reason) where torch sees no CUDA device.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from tests.learner_batches import recorded_learner_life, tiny_causal_lm
from turnstream.core.config import Config, LearnerSection

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason=f"no CUDA device visible to torch {torch.__version__}")]


def recorded_cuda_run(tmp_path, device: str = "cuda") -> Config:
    """Six recorded steps of the tiny model on `device` (bf16 autocast on CUDA), a checkpoint every two."""
    tiny_causal_lm(seed=0).save_pretrained(tmp_path / "base")
    cfg = Config()
    cfg.model.path, cfg.run.run_dir, cfg.run.seed = str(tmp_path / "base"), str(tmp_path / "run"), 3
    cfg.learner = LearnerSection(lr=1e-2, max_tokens_per_microbatch=40, device=device, attn_implementation="sdpa",
                                 minibatches=2, checkpoint_every=2, keep_checkpoints=10, record=True)
    recorded_learner_life(cfg, {v: 100 + v for v in range(1, 7)}, stop_after=6)
    return cfg


@pytest.mark.parametrize("deterministic", [False, True], ids=["default-kernels", "deterministic"])
def test_a_cuda_replay_says_how_close_it_comes(tmp_path, record_property, deterministic):
    cfg = recorded_cuda_run(tmp_path)
    # a process of its own, as a user runs it: --deterministic configures cuBLAS before CUDA starts
    done = subprocess.run([sys.executable, "-m", "turnstream.cli", "replay", str(cfg.run_dir),
                           *(["--deterministic"] if deterministic else [])], capture_output=True, text=True)
    code, lines = done.returncode, done.stdout.strip().splitlines()
    assert lines, done.stderr[-2000:]
    summary = json.loads(lines[-1])
    record_property("replay_equal", summary["equal"])
    record_property("replay_max_abs_diff", summary["max_abs_diff"])
    record_property("replay_checkpoints", json.dumps(summary["checkpoints"]))
    # every checkpoint is compared, so the status says equal (0) or differs (1), as the summary does; a difference
    # is the figure this test reports
    assert [c["version"] for c in summary["checkpoints"]] == [2, 4, 6] and summary["compared_through"] == 6
    assert code == (0 if summary["equal"] else 1), lines
    assert summary["device"].startswith("cuda") and summary["deterministic"] is deterministic
    assert summary["rng_mismatches"] == 0  # the Trainer's generator follows the run's, whatever the kernels do
    assert math.isfinite(summary["max_abs_diff"])
