"""Token ids as text, with the run's tokenizer (model.path), or as ids where the model directory has none."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

log = logging.getLogger("turnstream.inspect")


class TokenText(Protocol):
    def text(self, ids) -> str: ...


class TokenizerText:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def text(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)


class IdText:
    def text(self, ids) -> str:
        return " ".join(f"<{int(i)}>" for i in ids)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def token_text(model_path: str) -> TokenText:
    # without its files transformers would build an empty tokenizer from the model's type, decoding every id to ""
    if any((Path(model_path) / name).is_file() for name in TOKENIZER_FILES):
        try:
            from transformers import AutoTokenizer

            return TokenizerText(AutoTokenizer.from_pretrained(model_path))
        except (OSError, ValueError) as exc:
            log.warning("the tokenizer in %s does not load (%s): tokens are shown as ids", model_path, exc)
    return IdText()
