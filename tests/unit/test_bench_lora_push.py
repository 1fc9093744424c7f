"""`turnstream bench lora-push`: the bytes each backend writes, and their ratio, on the tiny shapes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_lora_push_writes_the_adapters_bytes_against_every_weight_s(tmp_path):
    cmd = [sys.executable, "-m", "turnstream.cli", "bench", "lora-push", "--model-config", "tiny", "--rank", "4",
           "--target-modules", "q_proj,v_proj", "--dtype", "float32", "--out", str(tmp_path / "out")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    header = 64 << 10  # safetensors' JSON header: names, shapes, offsets
    assert 0 <= r["lora_push_bytes"] - 4 * r["adapter_params"] < header
    assert 0 <= r["full_push_bytes"] - 4 * r["params"] < header  # a tied embedding counted once
    assert r["lora_push_bytes_ratio"] == r["lora_push_bytes"] / r["full_push_bytes"] < 0.05
    assert not (tmp_path / "out").exists()  # the scratch files are gone


def test_measure_takes_a_transformers_config(tmp_path):
    """bench learner --parallel can report the figure for the shapes it built."""
    from benchmarks.learner_mfu import model_config
    from benchmarks.lora_push import measure
    from turnstream.core.config_lora import LoraSection

    r = measure(model_config("tiny"), LoraSection(rank=8), "bfloat16", tmp_path / "out")
    assert 0 < r["lora_push_bytes_ratio"] < 0.1 and r["dtype"] == "bfloat16"


def test_counted_full_push_is_the_bytes_the_disk_backend_writes(tmp_path):
    """The bench counts the full push on a meta-device model; a real model's push writes exactly that many."""
    import torch
    from transformers import AutoModelForCausalLM

    from benchmarks.learner_mfu import model_config
    from benchmarks.lora_push import weight_bytes, measure
    from turnstream.core.config_lora import LoraSection
    from turnstream.learner.weights.buckets import WeightBuckets
    from turnstream.learner.sync.disk import DiskWeightSync
    from turnstream.learner.weights.source import policy_tensors

    shapes = model_config("tiny")
    r = measure(shapes, LoraSection(rank=4), "bfloat16", tmp_path / "out")
    model = AutoModelForCausalLM.from_config(shapes, dtype=torch.float32)
    written = DiskWeightSync(["http://127.0.0.1:9"], tmp_path / "w", tmp_path).save(
        WeightBuckets(policy_tensors(model), torch.bfloat16), 1)  # what the learner's push hands the backend
    assert r["full_push_bytes"] == weight_bytes(written)
    assert r["params"] == sum(p.numel() for p in model.parameters())
