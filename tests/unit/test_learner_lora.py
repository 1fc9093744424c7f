"""learner.lora: adapters train on a frozen base; what a push carries (the adapters under a PEFT adapter's
names, or the merged weights) gives the trained model's outputs; checkpoints keep the adapter; the servers'
command loads adapters at run time. Against a real vLLM server: tests/e2e/test_lora_vllm.py."""
from __future__ import annotations

import shutil

import pytest
import torch

from tests.learner_batches import synthetic_batch, tiny_causal_lm
from turnstream.core.config import LearnerSection, VllmSection
from turnstream.core.config_lora import LoraSection
from turnstream.learner import lora
from turnstream.learner.checkpoint import store
from turnstream.learner.weights.source import push_tensors
from turnstream.learner.step.trainer import Trainer

LORA = LoraSection(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj", "down_proj"])


def _cfg(**kw) -> LearnerSection:
    return LearnerSection(lr=1e-2, device="cpu", lora=LORA, **kw)


def _logits(model, seed: int = 0) -> torch.Tensor:
    ids = torch.randint(1, 64, (2, 12), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model.eval()(ids).logits


def _trained(steps: int = 2, estimator: str = "spo"):
    cfg = _cfg(estimator=estimator)
    model = lora.attach(tiny_causal_lm(), cfg.lora)
    trainer = Trainer(model, cfg, seed=0)
    for s in range(steps):
        trainer.step(synthetic_batch(8, group=4, seed=100 + s))
    return model, trainer


@pytest.mark.parametrize("estimator", ["spo", "turn_gae"])  # turn_gae: the shared value head trains too
def test_only_the_adapters_and_the_value_head_train(estimator):
    base = {k: v.clone() for k, v in tiny_causal_lm().state_dict().items()}
    model, trainer = _trained(estimator=estimator)
    state = model.state_dict()
    for name, before in base.items():  # every base weight, under its adapted name where it has adapters
        adapted = name.replace(".weight", ".base_layer.weight").replace(".bias", ".base_layer.bias")
        assert torch.equal(state.get(name, state.get(adapted)), before), name
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(lora.is_adapter(n) for n in trained)
    assert len(trained) == 2 * 3  # lora_A and lora_B of the three targets in the one decoder layer
    b = [p for n, p in model.named_parameters() if ".lora_B." in n]
    assert all(p.abs().sum() > 0 for p in b)  # B starts at zero: a step moved it
    optimized = {id(p) for p in trainer._params() if p in trainer.optimizer.state}
    assert optimized == {id(p) for n, p in model.named_parameters() if p.requires_grad} | (
        {id(p) for p in trainer.net.head.parameters()} if estimator == "turn_gae" else set())


def test_adapter_push_is_a_peft_adapter_that_gives_the_trained_model(tmp_path):
    from peft import PeftModel
    from peft.utils import get_peft_model_state_dict

    from turnstream.learner.sync.lora import LoraAdapterSync
    from turnstream.learner.weights.buckets import WeightBuckets

    model, _ = _trained()
    pushed = push_tensors(model.state_dict(), LORA)
    # what peft itself saves for this model, under the names a PeftModel (which wraps it) writes to its file
    reference = {"base_model.model." + k: v for k, v in get_peft_model_state_dict(model).items()}
    assert pushed.keys() == reference.keys() and all(torch.equal(pushed[k], reference[k]) for k in pushed)
    base_dir = tmp_path / "base"
    tiny_causal_lm().save_pretrained(base_dir)
    sync = LoraAdapterSync(["http://127.0.0.1:9"], tmp_path / "weights", LORA, base_dir)
    path = sync.save(WeightBuckets(pushed, None), version=3)
    assert path.name == "v000003"
    assert {"adapter_config.json", lora.ADAPTER_FILE} <= {p.name for p in path.iterdir()}
    assert sync.last_bytes == sum(t.numel() * t.element_size() for t in pushed.values())
    loaded = PeftModel.from_pretrained(tiny_causal_lm(), str(path))
    assert torch.allclose(_logits(loaded), _logits(model), atol=1e-6)


def test_merged_push_is_the_base_s_names_with_the_update_folded_in():
    from transformers import Qwen2ForCausalLM

    model, _ = _trained()
    merged = push_tensors(model.state_dict(), LORA.model_copy(update={"push": "merged"}))
    plain = tiny_causal_lm()
    assert merged.keys() == plain.state_dict().keys()
    plain.load_state_dict(merged)
    assert isinstance(plain, Qwen2ForCausalLM)
    assert torch.allclose(_logits(plain), _logits(model), atol=1e-5)
    assert not torch.allclose(_logits(plain), _logits(tiny_causal_lm()), atol=1e-3)  # the update is in it


def test_checkpoint_holds_the_adapter_and_a_resume_rebuilds_the_model(tmp_path):
    model, trainer = _trained()
    base_dir = tmp_path / "base"
    tiny_causal_lm().save_pretrained(base_dir)
    path = store.save(tmp_path / "ckpt", trainer, base_dir, keep=2)
    files = {p.name for p in (path / "model").iterdir()}
    assert lora.ADAPTER_FILE in files and "model.safetensors" not in files  # the base is model.path's
    resumed = lora.attach(tiny_causal_lm(), LORA, path / "model")
    assert torch.equal(_logits(resumed), _logits(model))
    again = Trainer(resumed, _cfg(), seed=0)
    store.restore(path, again)
    assert again.version == trainer.version == 2


def test_resuming_across_a_change_of_lora_is_a_config_error(tmp_path):
    from turnstream.core.configtools import ConfigError

    plain = tmp_path / "plain" / "model"
    tiny_causal_lm().save_pretrained(plain)
    with pytest.raises(ConfigError, match="written without LoRA; resume it without"):
        lora.attach(tiny_causal_lm(), LORA, plain)
    adapted = tmp_path / "adapted" / "model"
    lora.attach(tiny_causal_lm(), LORA).save_pretrained(adapted)
    with pytest.raises(ConfigError, match="written with LoRA; resume it with"):
        lora.attach(tiny_causal_lm(), None, adapted)


def test_unknown_target_module_is_a_config_error():
    from turnstream.core.configtools import ConfigError

    with pytest.raises(ConfigError, match="learner.lora.target_modules"):
        lora.attach(tiny_causal_lm(), LoraSection(target_modules=["no_such_proj"]))


def test_servers_load_adapters_at_run_time_only_for_adapter_pushes():
    from turnstream.launch.vllm_server import vllm_command

    argv, env = vllm_command("/m", "127.0.0.1", 8000, VllmSection(), LoraSection(rank=12))
    assert argv[argv.index("--max-lora-rank") + 1] == "16" and "--enable-lora" in argv  # vLLM's next size
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
    for lora_cfg in (None, LoraSection(push="merged")):
        argv, env = vllm_command("/m", "127.0.0.1", 8000, VllmSection(), lora_cfg)
        assert "--enable-lora" not in argv and "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in env


def test_the_lora_table_round_trips_through_the_resolved_config(tmp_path):
    from turnstream.core.config import Config, load_config

    for cfg in (Config(), Config(learner=LearnerSection(lora=LORA))):
        (tmp_path / "run.toml").write_text(cfg.dumps())
        assert load_config(tmp_path / "run.toml") == cfg


def test_export_of_a_lora_checkpoint_is_the_base_with_the_update_merged_in(tmp_path):
    """`turnstream export` of a LoRA checkpoint (its model/ holds the adapter): plain weights that transformers
    loads as the trained model, the base read from adapter_config.json's base_model_name_or_path."""
    from transformers import AutoModelForCausalLM

    from turnstream.core.configtools import ConfigError
    from turnstream.learner.checkpoint.export import export

    base_dir = tmp_path / "base"
    tiny_causal_lm().save_pretrained(base_dir)
    model = lora.attach(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32), LORA)
    trainer = Trainer(model, _cfg(), seed=0)
    trainer.step(synthetic_batch(8, group=4, seed=100))
    path = store.save(tmp_path / "ckpt", trainer, base_dir, keep=2)
    out = export(path, tmp_path / "exported", dtype="float32")
    assert not (out / "adapter_config.json").exists()
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert torch.allclose(_logits(exported), _logits(model), atol=1e-5)
    assert not torch.allclose(_logits(exported), _logits(tiny_causal_lm()), atol=1e-3)
    shutil.rmtree(base_dir)
    with pytest.raises(ConfigError, match="base model"):
        export(path, tmp_path / "again")
