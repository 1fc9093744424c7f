"""Build a tiny Qwen2 checkpoint with a locally trained tokenizer (nothing is downloaded).

vLLM's CPU attention needs head_dim 64, so the model is 2 heads of 64 in a 128-wide residual stream.
The tokenizer is a byte-level BPE trained on text the shipped environments produce, so every
environment string tokenizes without unknown tokens and single characters (actions) are single tokens.
"""
from __future__ import annotations

import json
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _training_corpus(seed: int) -> list[str]:
    """Text shaped like what the environments and chat template produce, plus some filler words."""
    import random

    rng = random.Random(seed)
    lines = []
    for _ in range(2000):
        goal = rng.choice("LR")
        pos = rng.randint(-9, 9)
        lines.append(f"<|im_start|>user\ngoal {goal} at {rng.randint(1, 9)} pos {pos}<|im_end|>\n")
        lines.append(f"<|im_start|>assistant\n{rng.choice('LR')}<|im_end|>\n<|im_start|>user\npos {pos}<|im_end|>\n")
        lines.append(" ".join(rng.choice(["move", "left", "right", "walk", "the", "to", "a", "win", "lose"])
                              for _ in range(8)))
        lines.append(" ".join(str(rng.randint(0, 999)) for _ in range(6)))
    return lines


def build_tokenizer(vocab_size: int, seed: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_corpus(seed), trainer=trainer)
    return tok


def make_tiny_model(out_dir: str | Path, seed: int = 0, hidden: int = 128, layers: int = 2,
                    vocab_size: int = 512) -> Path:
    """Write a Hugging Face checkpoint directory; identical bytes for identical arguments."""
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(vocab_size, seed)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        unk_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    head_dim = 64
    config = Qwen2Config(
        vocab_size=tok.get_vocab_size(), hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=hidden // head_dim,
        num_key_value_heads=hidden // head_dim, head_dim=head_dim, max_position_embeddings=1024,
        tie_word_embeddings=False, torch_dtype="float32",
        eos_token_id=tok.token_to_id("<|im_end|>"), pad_token_id=tok.token_to_id("<|endoftext|>"),
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    (out / "turnstream_model.json").write_text(json.dumps({"seed": seed, "hidden": hidden, "layers": layers,
                                                           "vocab_size": vocab_size}) + "\n")
    return out
