"""One process: the sharded checkpoint format (learner/checkpoint/sharded.py) resumes exactly, `turnstream export` turns
it into a Hugging Face directory that transformers loads, and a push's buckets hold one bucket at a time.
Several ranks: tests/integration/test_learner_fsdp2.py."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.learner_batches import synthetic_batch, tiny_causal_lm
from tests.push_memory import peak_bytes_held
from turnstream.core.config import LearnerSection
from turnstream.core.configtools import ConfigError
from turnstream.learner.checkpoint import sharded, store
from turnstream.learner.checkpoint.export import export
from turnstream.learner.checkpoint.layout import latest, tmp_name
from turnstream.learner.step.trainer import Trainer
from turnstream.learner.weights.buckets import TensorSpec, WeightBuckets, plan
from turnstream.learner.sync.disk import DiskWeightSync


def _trainer(estimator: str = "spo") -> Trainer:
    cfg = LearnerSection(estimator=estimator, lr=1e-2, max_tokens_per_microbatch=40, device="cpu", parallel="fsdp2")
    return Trainer(tiny_causal_lm(seed=0), cfg, seed=0)


def _source(tmp_path):
    src = tmp_path / "src"
    tiny_causal_lm(seed=0).save_pretrained(src)
    return src


def test_sharded_checkpoint_resumes_weights_adam_tracker_and_rng(tmp_path):
    a = _trainer("turn_gae")  # a value head too
    for s in range(2):
        a.step(synthetic_batch(12, group=4, seed=100 + s))
    root = tmp_path / "ckpt"
    path = store.save(root, a, _source(tmp_path), keep=2, tmp=tmp_name(2, 1))
    assert path.name == "step-000002" and latest(root) == path and sharded.is_sharded(path)
    assert not list(root.glob(".tmp-*")) and not list((path / "model").glob("*.safetensors"))
    b = _trainer("turn_gae")
    store.restore(path, b)
    assert b.version == 2 and b.estimator.state_dict() == a.estimator.state_dict()
    for p, q in zip(a._params(), b._params()):
        assert torch.equal(p, q)
        assert all(torch.equal(a.optimizer.state[p][k], b.optimizer.state[q][k]) for k in ("exp_avg", "exp_avg_sq"))
    for t in (a, b):
        t.step(synthetic_batch(12, group=4, seed=102))
    assert all(torch.equal(p, q) for p, q in zip(a._params(), b._params()))


@pytest.mark.parametrize("tied", [False, True])
def test_a_sharded_resume_reads_no_weights_of_model_path(tmp_path, tied):
    """learner/main.py builds the policy of a sharded resume from model.path's config alone (every weight comes
    from dcp/): a model.path whose weights file is gone resumes to the checkpoint's weights, tied ones tied."""
    from transformers import AutoModelForCausalLM

    from turnstream.core.config import Config
    from turnstream.learner.main import build_trainer
    from turnstream.learner.rank_commands import save_checkpoint

    config = tiny_causal_lm().config
    config.tie_word_embeddings = tied
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(tmp_path / "base")
    cfg = Config()
    cfg.model.path, cfg.run.run_dir = str(tmp_path / "base"), str(tmp_path / "run")
    cfg.learner = LearnerSection(estimator="spo", lr=1e-2, max_tokens_per_microbatch=40, device="cpu",
                                 parallel="fsdp2", attn_implementation="eager")
    _, a, resumed_from = build_trainer(cfg)
    assert resumed_from is None
    a.step(synthetic_batch(12, group=4, seed=100))
    save_checkpoint(cfg, a)
    for weights in (tmp_path / "base").glob("*.safetensors"):
        weights.unlink()
    model, b, resumed_from = build_trainer(cfg)
    assert sharded.is_sharded(resumed_from) and b.version == a.version == 1
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    for (name, p), q in zip(a.net.model.state_dict().items(), model.state_dict().values()):
        assert torch.equal(p, q), name
    assert all(torch.equal(x, y) for x, y in zip(a.net.model.buffers(), model.buffers()))  # rotary frequencies
    for t in (a, b):
        t.step(synthetic_batch(12, group=4, seed=101))
    assert all(torch.equal(p, q) for p, q in zip(a._params(), b._params()))


def test_export_of_a_sharded_checkpoint_loads_in_transformers_with_the_learners_logits(tmp_path):
    from transformers import AutoModelForCausalLM

    a = _trainer()
    a.step(synthetic_batch(12, group=4, seed=100))
    path = store.save(tmp_path / "ckpt", a, _source(tmp_path), keep=2, tmp="tmp")
    out = export(tmp_path / "ckpt", tmp_path / "hf", shard_mb=0)  # the latest checkpoint of a checkpoints dir
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ids = torch.arange(1, 20)[None]
    assert all(torch.equal(loaded.state_dict()[k], t) for k, t in a.net.model.state_dict().items())
    with torch.no_grad():  # sdpa here, eager in the learner's tiny model: equal up to float rounding
        assert torch.allclose(loaded(ids).logits, a.net.model(ids).logits, atol=1e-5)
    with pytest.raises(ConfigError, match="exists and is not empty"):
        export(path, out)


def test_export_command_of_a_single_file_checkpoint_in_shards(tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = LearnerSection(estimator="spo", lr=1e-2, device="cpu")
    a = Trainer(tiny_causal_lm(seed=0), cfg, seed=0)
    a.step(synthetic_batch(12, group=4, seed=100))
    store.save(tmp_path / "run" / "checkpoints", a, _source(tmp_path), keep=2)
    proc = subprocess.run([sys.executable, "-m", "turnstream.cli", "export", str(tmp_path / "run"),
                           str(tmp_path / "hf"), "--dtype", "bfloat16", "--shard-mb", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert loaded.dtype == torch.bfloat16
    for name, t in a.net.model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], t.to(torch.bfloat16))


def test_plan_keeps_buckets_under_the_size_and_a_larger_tensor_alone():
    specs = [TensorSpec(str(i), (n,), torch.float32) for i, n in enumerate([10, 10, 30, 5, 5, 5])]
    sizes = [[s.nbytes for s in b] for b in plan(specs, 80)]
    assert sizes == [[40, 40], [120], [20, 20, 20]]
    assert len(plan(specs, 0)) == 1


def test_a_push_holds_one_bucket_of_weights_at_a_time(tmp_path):
    """bf16 buckets are new tensors: weak references show how many bytes of them are alive at once while the
    disk backend writes a push (its reading side counts as holding them)."""
    model = tiny_causal_lm(seed=0, hidden=64)
    tensors = dict(model.state_dict(keep_vars=True))
    bucket_bytes = 20_000
    source = WeightBuckets(tensors, torch.bfloat16, bucket_bytes)
    peak = peak_bytes_held(source, tmp_path / "out")
    largest = max(s.nbytes for s in source.specs)
    print(f"{len(source.buckets)} buckets of at most {bucket_bytes} B ({source.nbytes} B in all): peak held {peak} B")
    assert len(source.buckets) > 3 and peak <= max(bucket_bytes, largest) < source.nbytes / 3
    model.save_pretrained(tmp_path / "src")  # its config.json goes with every push
    sync = DiskWeightSync([], tmp_path / "weights", tmp_path / "src")
    path = sync.save(WeightBuckets(tensors, torch.bfloat16, bucket_bytes), 1)
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(path)  # shards + index: a Hugging Face directory
    assert all(torch.equal(loaded.state_dict()[k], t.to(torch.bfloat16)) for k, t in model.state_dict().items())
