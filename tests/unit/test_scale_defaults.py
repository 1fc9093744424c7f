"""The learner settings left at "auto" follow the size of the policy: the tiny model's rates below ten million
parameters, a pretrained LLM's from there up; a number in the config always wins."""
from __future__ import annotations

import logging

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from tests.learner_batches import synthetic_batch, tiny_causal_lm
from turnstream.core.config import Config, LearnerSection, load_config
from turnstream.core.config_learner import (AUTO_SETTINGS, LARGE_SCALE, PRETRAINED, PRETRAINED_LORA, PRETRAINED_SCALE,
                                            SMALL_PRETRAINED, SMALL_PRETRAINED_LORA, TINY)
from turnstream.learner.scale_defaults import parameter_count, resolve, value_of
from turnstream.learner.step.trainer import Trainer


def llm_sized_checkpoint(path) -> int:
    """A random Qwen2 just past the pretrained scale (4 layers, 512 wide), saved; returns its parameter count."""
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=512, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=8, head_dim=64, max_position_embeddings=256,
                         pad_token_id=0, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.save_pretrained(path)
    return parameter_count(model)


def auto_values(cfg: LearnerSection) -> list:
    return [value_of(cfg, setting) for setting in AUTO_SETTINGS]


def optimizer_rates(trainer: Trainer) -> list[float]:
    return [group["lr"] for group in trainer.optimizer.param_groups]


def test_the_defaults_are_auto_and_a_number_stays_as_given():
    assert auto_values(LearnerSection()) == ["auto"] * 4
    given = LearnerSection(lr=3e-4, warmup_steps=5, entropy_coef=0.05)
    assert auto_values(resolve(given, 10 * PRETRAINED_SCALE)) == [3e-4, 5, 0.05, SMALL_PRETRAINED.critic_lr]
    assert given.critic.lr == "auto"  # resolved in a copy
    cfg = load_config(None, ['learner.lr="auto"', "learner.entropy_coef=0.1"])
    assert (cfg.learner.lr, cfg.learner.entropy_coef) == ("auto", 0.1)


@pytest.mark.parametrize("parameters,lora,expected", [
    (PRETRAINED_SCALE - 1, False, TINY), (PRETRAINED_SCALE - 1, True, TINY),
    (PRETRAINED_SCALE, False, SMALL_PRETRAINED), (PRETRAINED_SCALE, True, SMALL_PRETRAINED_LORA),
    (LARGE_SCALE - 1, False, SMALL_PRETRAINED), (LARGE_SCALE, False, PRETRAINED), (LARGE_SCALE, True, PRETRAINED_LORA)])
def test_the_size_picks_the_rates(parameters, lora, expected):
    lora_section = {"lora": {"rank": 8}} if lora else {}
    cfg = resolve(LearnerSection.model_validate(lora_section), parameters)
    assert auto_values(cfg) == [expected.value(setting) for setting in AUTO_SETTINGS]


def test_the_trainer_of_the_tiny_model_keeps_the_tiny_rates():
    trainer = Trainer(tiny_causal_lm(), LearnerSection(device="cpu"), seed=0)
    assert optimizer_rates(trainer) == [TINY.lr]  # no warm-up: the first step at the full rate
    assert trainer.cfg.entropy_coef == TINY.entropy_coef


def test_each_step_reports_the_rate_it_trained_at_through_the_warm_up():
    trainer = Trainer(tiny_causal_lm(), LearnerSection(device="cpu", warmup_steps=4), seed=0)
    rates = [trainer.step(synthetic_batch(8, seed=i))["learning_rate"] for i in range(5)]
    assert rates == pytest.approx([TINY.lr * k / 4 for k in (1, 2, 3, 4, 4)])


def test_the_learner_of_an_llm_sized_checkpoint_trains_at_a_pretrained_models_rates(tmp_path, caplog):
    """The learner process's own builder (learner/main.py) on a checkpoint read from disk, with a value head."""
    from turnstream.learner.main import build_trainer

    parameters = llm_sized_checkpoint(tmp_path / "model")
    assert parameters >= PRETRAINED_SCALE
    cfg = Config()
    cfg.model.path, cfg.run.run_dir = str(tmp_path / "model"), str(tmp_path / "run")
    cfg.learner = LearnerSection(estimator="turn_gae", device="cpu", attn_implementation="eager")
    with caplog.at_level(logging.INFO, logger="turnstream.learner"):
        _, trainer, _ = build_trainer(cfg)
    assert optimizer_rates(trainer) == pytest.approx([SMALL_PRETRAINED.lr, SMALL_PRETRAINED.critic_lr])  # no warm-up
    assert trainer.cfg.entropy_coef == 0 and trainer.cfg.warmup_steps == SMALL_PRETRAINED.warmup_steps
    assert f"for a policy of {parameters} parameters, auto settings: lr 2e-05, warmup_steps 0, entropy_coef 0, " \
           "critic.lr 2e-05" in caplog.text
