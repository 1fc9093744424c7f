"""Incremental chat-format token ids.

The context is the exact token list vLLM saw plus what it returned; observations are appended as
token deltas of the chat template (ChatML here, the format of the tiny model and of Qwen models).
Earlier text is never re-tokenised, so the learner trains on exactly the sampled tokens.
"""
from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer


class ChatTokens:
    def __init__(self, model_dir: str | Path, end_of_turn: str = "<|im_end|>"):
        self.tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
        eot = self.tok.token_to_id(end_of_turn)
        if eot is None:
            raise ValueError(f"tokenizer has no {end_of_turn!r} token")
        self.end_of_turn_id = eot
        self.end_of_turn = end_of_turn

    def first_turn(self, observation: str) -> list[int]:
        return self.encode(f"<|im_start|>user\n{observation}<|im_end|>\n<|im_start|>assistant\n")

    def next_turn(self, observation: str, last_generated: list[int]) -> list[int]:
        """Delta after the model's reply: close its turn (unless it did), add the user turn, reopen."""
        closing = "" if last_generated and last_generated[-1] == self.end_of_turn_id else self.end_of_turn
        return self.encode(f"{closing}\n<|im_start|>user\n{observation}<|im_end|>\n<|im_start|>assistant\n")

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def single_token_id(self, text: str) -> int:
        ids = self.encode(text)
        if len(ids) != 1:
            raise ValueError(f"action {text!r} is {len(ids)} tokens under this tokenizer; it must be one")
        return ids[0]
