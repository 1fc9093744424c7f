"""The learner settings left at "auto" follow the size of the policy: the tiny model's rates and no micro-batch
budget below ten million parameters, a pretrained LLM's rates and budget from there up; a number in the config
always wins."""
from __future__ import annotations

import logging

import pytest
from tests.learner_batches import synthetic_batch, tiny_causal_lm
from turnstream.core.config import Config, LearnerSection, load_config
from turnstream.core.config_learner import (AUTO_SETTINGS, LARGE_SCALE, PRETRAINED, PRETRAINED_LORA, PRETRAINED_SCALE,
                                            SMALL_PRETRAINED, SMALL_PRETRAINED_LORA, TINY)
from turnstream.learner.scale_defaults import (checkpoint_parameters, parameter_count, resolve,
                                               resolve_for_checkpoint, value_of)
from turnstream.learner.step.trainer import Trainer


def auto_values(cfg: LearnerSection) -> list:
    return [value_of(cfg, setting) for setting in AUTO_SETTINGS]


def optimizer_rates(trainer: Trainer) -> list[float]:
    return [group["lr"] for group in trainer.optimizer.param_groups]


def test_the_defaults_are_auto_and_a_number_stays_as_given():
    assert auto_values(LearnerSection()) == ["auto"] * 5
    given = LearnerSection(lr=3e-4, warmup_steps=5, entropy_coef=0.05, max_tokens_per_microbatch=300)
    assert auto_values(resolve(given, 10 * PRETRAINED_SCALE)) == [3e-4, 5, 0.05, SMALL_PRETRAINED.critic_lr, 300]
    assert resolve(LearnerSection(max_tokens_per_microbatch=0), 10 * PRETRAINED_SCALE).max_tokens_per_microbatch == 0
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


@pytest.mark.parametrize("lora", [False, True])
def test_the_micro_batch_budget_follows_the_size(lora):
    """4096 for the tiny model (no bound on memory, but padded rows sorted by length); SmolLM2-135M's configs' 2048
    for a small pretrained model, whose whole batch in one forward ran the learner out of memory; LoRA keeps the
    activations."""
    section = LearnerSection.model_validate({"lora": {"rank": 8}} if lora else {})
    assert resolve(section, PRETRAINED_SCALE - 1).max_tokens_per_microbatch == 4096
    assert resolve(section, PRETRAINED_SCALE).max_tokens_per_microbatch == 2048
    assert resolve(section, LARGE_SCALE - 1).max_tokens_per_microbatch == 2048
    large = resolve(section, LARGE_SCALE).max_tokens_per_microbatch
    assert 0 < large < 2048 and large == PRETRAINED.max_tokens_per_microbatch  # a wider, deeper model


def test_an_auto_budget_holds_a_whole_context():
    """A budget below vllm.max_model_len would drop every episode that fills its context; a number given stays as
    it is."""
    section = LearnerSection()
    assert resolve(section, LARGE_SCALE, longest_context=4096).max_tokens_per_microbatch == 4096
    assert resolve(section, PRETRAINED_SCALE, longest_context=512).max_tokens_per_microbatch == 2048
    assert resolve(section, PRETRAINED_SCALE - 1, longest_context=8192).max_tokens_per_microbatch == 8192
    given = LearnerSection(max_tokens_per_microbatch=300)
    assert resolve(given, LARGE_SCALE, longest_context=4096).max_tokens_per_microbatch == 300


def test_the_trainer_of_the_tiny_model_keeps_the_tiny_rates():
    trainer = Trainer(tiny_causal_lm(), LearnerSection(device="cpu"), seed=0)
    assert optimizer_rates(trainer) == [TINY.lr]  # no warm-up: the first step at the full rate
    assert trainer.cfg.entropy_coef == TINY.entropy_coef
    assert trainer.cfg.max_tokens_per_microbatch == TINY.max_tokens_per_microbatch and not trainer.packed


def test_each_step_reports_the_rate_it_trained_at_through_the_warm_up():
    trainer = Trainer(tiny_causal_lm(), LearnerSection(device="cpu", warmup_steps=4), seed=0)
    rates = [trainer.step(synthetic_batch(8, seed=i))["learning_rate"] for i in range(5)]
    assert rates == pytest.approx([TINY.lr * k / 4 for k in (1, 2, 3, 4, 4)])


def test_the_learner_of_an_llm_sized_checkpoint_trains_at_a_pretrained_models_rates(llm_sized_model, tmp_path,
                                                                                       caplog):
    """The learner process's own builder (learner/main.py) on a checkpoint read from disk, with a value head."""
    from turnstream.learner.main import build_trainer

    parameters = checkpoint_parameters(llm_sized_model)
    assert parameters >= PRETRAINED_SCALE
    cfg = Config()
    cfg.model.path, cfg.run.run_dir = str(llm_sized_model), str(tmp_path / "run")
    cfg.learner = LearnerSection(estimator="turn_gae", device="cpu", attn_implementation="eager")
    cfg.vllm.max_model_len = 3000  # a context longer than the size's budget: the budget holds it
    with caplog.at_level(logging.INFO, logger="turnstream.learner"):
        _, trainer, _ = build_trainer(cfg)
    assert optimizer_rates(trainer) == pytest.approx([SMALL_PRETRAINED.lr, SMALL_PRETRAINED.critic_lr])  # no warm-up
    assert trainer.cfg.entropy_coef == 0 and trainer.cfg.warmup_steps == SMALL_PRETRAINED.warmup_steps
    assert trainer.policy_parameters == parameters and trainer.cfg.max_tokens_per_microbatch == 3000
    assert f"for a policy of {parameters} parameters, auto settings: lr 2e-05, warmup_steps 0, entropy_coef 0, " \
           "critic.lr 2e-05, max_tokens_per_microbatch 3000" in caplog.text


def test_the_checkpoints_parameters_are_counted_without_loading_it(tmp_path):
    """What reads the settings before any model is loaded (sft, inspect, the TRL baseline) counts the checkpoint's
    parameters from its config, to the learner's count of the loaded model."""
    model = tiny_causal_lm()
    model.save_pretrained(tmp_path / "model")
    assert checkpoint_parameters(tmp_path / "model") == parameter_count(model)
    with pytest.raises(FileNotFoundError, match="no config.json"):  # a count of 0 would read as the tiny model
        checkpoint_parameters(tmp_path)


def test_a_checkpoint_resolves_the_auto_settings_as_its_learner_would(llm_sized_model, tmp_path):
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(llm_sized_model)
    assert resolve_for_checkpoint(LearnerSection(), llm_sized_model) == resolve(LearnerSection(),
                                                                                parameter_count(loaded))
    numbers = LearnerSection.model_validate({"lr": 1e-4, "warmup_steps": 0, "entropy_coef": 0.0,
                                             "critic": {"lr": 1e-4}, "max_tokens_per_microbatch": 512})
    assert resolve_for_checkpoint(numbers, tmp_path) == numbers  # nothing to count: no checkpoint read
