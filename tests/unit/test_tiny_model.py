"""The tiny model is built locally, deterministically, in a form vLLM's CPU build can serve."""
from __future__ import annotations

import hashlib
import json

from turnstream.tiny_model import make_tiny_model


def _digest(directory) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path, tiny_model):
    again = make_tiny_model(tmp_path / "again", seed=0)
    assert _digest(again) == _digest(tiny_model)
    other = make_tiny_model(tmp_path / "other", seed=1)
    assert _digest(other)["model.safetensors"] != _digest(tiny_model)["model.safetensors"]


def test_checkpoint_shape_suits_vllm_cpu(tiny_model):
    config = json.loads((tiny_model / "config.json").read_text())
    assert config["head_dim"] == 64  # vLLM's CPU attention rejects smaller heads
    assert config["hidden_size"] == config["num_attention_heads"] * config["head_dim"]
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (tiny_model / name).exists()
    assert "im_start" in (tiny_model / "tokenizer_config.json").read_text() + (
        (tiny_model / "chat_template.jinja").read_text() if (tiny_model / "chat_template.jinja").exists() else "")
