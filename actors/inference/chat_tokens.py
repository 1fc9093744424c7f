"""Incremental chat-format token ids, rendered with the model's own chat template.

The context is the exact token list vLLM saw plus what it returned; observations are appended as token deltas
of the chat template (`chat_template` in the model folder's tokenizer_config.json: system, user and assistant
turns as the model was trained on them). Earlier text is never re-tokenised, so the learner trains on exactly the
sampled tokens.

A delta is read off the template rather than written here: the conversation so far is rendered with a
placeholder reply, then again with the next user turn and the generation prompt; what the second adds is the
delta, plus whatever the template writes after a reply (e.g. ChatML's `<|im_end|>\\n`) less the end-of-turn
token the model already generated when it stopped on it.
"""
from __future__ import annotations

import json
from pathlib import Path

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

# placeholders no template writes and no model generates: where the observation, an earlier user turn and a
# reply go in a rendering
_OBSERVATION, _EARLIER, _REPLY = "\x01", "\x02", "\x00reply\x00"


class ChatTokens:
    def __init__(self, model_dir: str | Path, end_of_turn: str = "<|im_end|>"):
        folder = Path(model_dir)
        self.tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        eot = self.tok.token_to_id(end_of_turn)
        if eot is None:
            raise ValueError(f"tokenizer has no {end_of_turn!r} token")
        self.end_of_turn_id = eot
        self.end_of_turn = end_of_turn
        self.template, self._special = _load_template(folder)
        self._after_reply, self._next_user = self._reply_closing_and_next_user()

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        """The template's text of a conversation (what transformers' apply_chat_template renders)."""
        return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt, **self._special)

    def first_turn(self, observation: str, system: str | None = None) -> list[int]:
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": _OBSERVATION})
        before, after = self.render(messages, True).split(_OBSERVATION)
        return self.encode(before + observation + after)

    def next_turn(self, observation: str, last_generated: list[int]) -> list[int]:
        """Delta after the model's reply: close its turn (less what it generated of that), the user turn, reopen."""
        closing = self._after_reply
        if last_generated and last_generated[-1] == self.end_of_turn_id and closing.startswith(self.end_of_turn):
            closing = closing[len(self.end_of_turn):]
        before, after = self._next_user
        return self.encode(closing + before + observation + after)

    def _reply_closing_and_next_user(self) -> tuple[str, tuple[str, str]]:
        talk = [{"role": "user", "content": _EARLIER}, {"role": "assistant", "content": _REPLY}]
        ended = self.render(talk, False)
        follow = self.render(talk + [{"role": "user", "content": _OBSERVATION}], True)
        if not follow.startswith(ended) or _REPLY not in ended:
            raise ValueError("the chat template does not extend a conversation by appending to it; turnstream "
                             "needs one that does (each turn's text must not depend on later turns)")
        closing = ended[ended.index(_REPLY) + len(_REPLY):]
        before, after = follow[len(ended):].split(_OBSERVATION)
        return closing, (before, after)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def single_token_id(self, text: str) -> int:
        ids = self.encode(text)
        if len(ids) != 1:
            raise ValueError(f"action {text!r} is {len(ids)} tokens under this tokenizer; it must be one")
        return ids[0]


def _load_template(folder: Path):
    """The compiled template (as transformers compiles it) and the special tokens it may name."""
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    template = config.get("chat_template")
    if template is None and (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()
    if not isinstance(template, str):
        raise ValueError(f"{folder} has no chat template (tokenizer_config.json's chat_template, or "
                         "chat_template.jinja): the actor renders every turn with it")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = _raise
    special = {name: _token_text(config.get(name)) for name in ("bos_token", "eos_token")}
    return env.from_string(template), special


def _token_text(token) -> str:
    """tokenizer_config.json writes a special token as its text or as {"content": text, ...}."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else ""


def _raise(message: str):
    raise ValueError(f"chat template: {message}")
