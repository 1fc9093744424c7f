"""`turnstream sft`'s training: the loss on the assistant tokens falls, micro-batches change nothing, the written
directory is a Hugging Face checkpoint that continues a trained conversation, and config errors are one line."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.chat_transcripts import transcript
from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.core.config import load_config
from turnstream.core.configtools import ConfigError
from turnstream.sft.run import warm_start
from turnstream.sft.train import SftTrainer
from turnstream.sft.transcripts import Limit, TranscriptRenderer

REPLIES = {"goal L at 3 pos 0": "move left", "goal R at 2 pos 0": "move right", "goal L at 7 pos 5": "walk to the win"}


def _transcripts() -> list[dict]:
    return [transcript([(user, reply), ("pos 1", reply.split()[-1])]) for user, reply in REPLIES.items()]


def _config(tiny_model, tmp_path, *sets: str):
    return load_config(None, [f"model.path={tiny_model}", f"run.run_dir={tmp_path / 'run'}", "sft.epochs=30",
                              "sft.lr=3e-3", "learner.device=cpu", *sets])


def test_warm_start_lowers_the_loss_and_writes_a_checkpoint_that_continues_the_conversation(tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM

    report = warm_start([*_transcripts(), {"messages": [{"role": "tool", "content": "x"}]}],
                        _config(tiny_model, tmp_path))
    assert report.output_dir == tmp_path / "run" / "sft"
    assert (report.trained, report.refused, report.steps) == (3, {"unknown_role": 1}, 30)
    assert report.loss_end < report.loss_start / 20, report.summary()
    assert report.losses[-1] < report.losses[0] / 20

    model = AutoModelForCausalLM.from_pretrained(report.output_dir, dtype=torch.float32).eval()
    chat = ChatTokens(report.output_dir)  # the tokenizer travelled with the weights
    for user, reply in REPLIES.items():
        prompt = chat.first_turn(user)
        out = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0, len(prompt):].tolist()
        assert out == chat.encode(reply) + [chat.end_of_turn_id]
    assert json.loads((report.output_dir / "config.json").read_text())["dtype"] == "float32"


@pytest.mark.parametrize("budget, packing", [(40, False), (60, True)])
def test_micro_batches_change_neither_the_loss_nor_the_gradient(tiny_model, tmp_path, budget, packing):
    cfg = _config(tiny_model, tmp_path, f"learner.max_tokens_per_microbatch={budget}",
                  f"learner.pack_sequences={str(packing).lower()}")
    renderer = TranscriptRenderer(ChatTokens(tiny_model), Limit(budget, "learner.max_tokens_per_microbatch"))
    items = [renderer.render(i, t) for i, t in enumerate(_transcripts(), 1)]
    whole, split = (SftTrainer(tiny_model, cfg.sft, c.learner) for c in (_config(tiny_model, tmp_path), cfg))
    assert split.packed is packing
    losses = [t.step(items)[0] for t in (whole, split)]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    for a, b in zip(whole.model.parameters(), split.model.parameters()):  # the step's gradient, kept after it
        assert torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-7)


def test_the_trainer_splits_by_the_budget_its_learner_would_choose(tiny_model, llm_sized_model, tmp_path):
    """learner.max_tokens_per_microbatch = "auto" is a number once the model is loaded: the tiny model's, a
    pretrained-sized one's budget, in micro-batches that hold the budget."""
    cfg = _config(tiny_model, tmp_path)
    assert SftTrainer(tiny_model, cfg.sft, cfg.learner).learner.max_tokens_per_microbatch == 4096
    sized = SftTrainer(llm_sized_model, cfg.sft, cfg.learner.model_copy(update={"attn_implementation": "eager"}))
    assert sized.learner.max_tokens_per_microbatch == 2048
    assert cfg.learner.max_tokens_per_microbatch == "auto"  # resolved in a copy


def _sft(config, *args):
    return subprocess.run([sys.executable, "-m", "turnstream.cli", "sft", "--config", str(config), *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("sets, setting", [
    ([], "sft.transcripts: required"),
    (["sft.transcripts=missing.jsonl"], "sft.transcripts: missing.jsonl is not a file"),
    (["sft.batch_transcripts=0"], "sft.batch_transcripts"),
    (["sft.rate=1"], "sft.rate: unknown field"),
])
def test_a_config_error_is_one_line_naming_the_setting(tmp_path, tiny_model, sets, setting):
    config = tmp_path / "sft.toml"
    config.write_text(f'[model]\npath = "{tiny_model}"\n')
    proc = _sft(config, *(a for s in sets for a in ("--set", s)))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(f"turnstream: config error: {setting}"), proc.stderr


def test_nothing_trainable_and_a_used_output_dir_are_config_errors(tmp_path, tiny_model):
    cfg = _config(tiny_model, tmp_path)
    with pytest.raises(ConfigError, match=r"sft.transcripts: no transcript can be trained \(refused: not_json 2\)"):
        warm_start(["not json", "{"], cfg)
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "file").write_text("x")
    with pytest.raises(ConfigError, match="sft.output_dir: .*used exists and is not an empty directory"):
        warm_start(_transcripts(), cfg, tmp_path / "used")
