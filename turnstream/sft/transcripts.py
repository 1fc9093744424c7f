"""Chat transcripts as the token ids an actor would have built, and which of them the model must learn.

An actor's context is `ChatTokens.first_turn(observation)`, then the tokens the model generated (its reply and
the end-of-turn token it stops on), then `ChatTokens.next_turn(observation, generated)`, and so on
(actors/play/env_loop.py). A transcript is rendered through the same calls, with each assistant message in the
place of a generation: its content's tokens and the end-of-turn token, exactly what the model must emit for
the actor to see this conversation. Those are the trained tokens; everything else is context.

A system message may open a transcript: it is rendered with the first user turn, through the model's chat
template, as an environment's `Reset.system` is. Transcripts meant for an environment's task should carry the
system message that environment sends, or none if it sends none. A last user message is left out:
no assistant token follows it.

A transcript the actor could not have produced is refused (`Refused`, with a reason among REASONS) rather than
repaired, so that what trains is always what an actor sees.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from turnstream.actors.inference.chat_tokens import ChatTokens

ROLES = ("system", "user", "assistant")
REASONS = ("not_json", "no_messages", "unknown_role", "missing_content", "bad_order", "no_assistant",
           "special_token", "over_context")


class Refused(ValueError):
    """A transcript that cannot be trained; `reason` is one of REASONS, str() says why in words."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


@dataclass(frozen=True)
class Rendered:
    """One transcript's token ids and, per token, whether the loss is on it (an assistant token)."""
    line: int  # 1-based: the line of the JSON lines file, or the position in a list of transcripts
    tokens: list[int]
    trained: list[bool]


@dataclass(frozen=True)
class Limit:
    """The most tokens a transcript may have, and the setting that says so (named in the refusal)."""
    tokens: int
    setting: str


class TranscriptRenderer:
    def __init__(self, chat: ChatTokens, limit: Limit):
        self.chat, self.limit = chat, limit
        # a content holding one of these would draw a turn boundary the actor never drew
        self.special = {i for i, t in chat.tok.get_added_tokens_decoder().items() if t.special}

    def render_line(self, line: int, text: str) -> Rendered:
        """One line of a JSON lines file; Refused when it is not a trainable transcript."""
        try:
            transcript = json.loads(text)
        except ValueError as exc:
            raise Refused("not_json", f"not JSON ({exc})") from None
        return self.render(line, transcript)

    def render(self, line: int, transcript) -> Rendered:
        """A parsed transcript ({"messages": [...]}); Refused when it is not trainable."""
        messages = transcript.get("messages") if isinstance(transcript, dict) else None
        if not isinstance(messages, list) or not messages:
            raise Refused("no_messages", 'expected an object {"messages": [...]} with at least one message')
        parsed = [_message(i, m) for i, m in enumerate(messages, 1)]
        for role, content in parsed:
            if any(i in self.special for i in self.chat.encode(content)):
                raise Refused("special_token", f"a {role} message holds a chat-format token (such as "
                              f"{self.chat.end_of_turn}) in its content")
        pairs, system = _turns(parsed)
        tokens, trained = [], []
        generated: list[int] | None = None
        for observation, reply in pairs:
            obs = (self.chat.first_turn(observation, system) if generated is None
                   else self.chat.next_turn(observation, generated))
            self._add(tokens, trained, obs, False)
            # what the model generates for this reply: its text, then the end-of-turn token it stops on
            generated = self.chat.encode(reply) + [self.chat.end_of_turn_id]
            self._add(tokens, trained, generated, True)
        if len(tokens) > self.limit.tokens:
            raise Refused("over_context", f"{len(tokens)} tokens, more than {self.limit.setting} = "
                          f"{self.limit.tokens}")
        return Rendered(line, tokens, trained)

    @staticmethod
    def _add(tokens: list[int], trained: list[bool], ids: list[int], train: bool) -> None:
        tokens += ids
        trained += [train] * len(ids)


def _message(index: int, raw) -> tuple[str, str]:
    if not isinstance(raw, dict):
        raise Refused("no_messages", f"message {index} is not an object")
    role = raw.get("role")
    if role not in ROLES:
        raise Refused("unknown_role", f"message {index} has role {role!r}; sft takes {', '.join(ROLES)}")
    content = raw.get("content")
    if not isinstance(content, str):
        raise Refused("missing_content", f"message {index} ({role}) has no string content")
    return role, content


def _turns(messages: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], str | None]:
    """(observation, reply) pairs, and the opening system message or None. Roles must alternate user,
    assistant from the first user message on: an actor's context has no other shape."""
    system = messages[0][1] if messages[0][0] == "system" else None
    first = 1 if system is not None else 0
    due = "user"
    for index, (role, _) in enumerate(messages[first:], first + 1):
        if role != due:
            raise Refused("bad_order", f"message {index} is {role!r} where {due!r} was due: after an optional "
                          "opening system message, turns alternate user, assistant")
        due = "assistant" if due == "user" else "user"
    turns = [content for _, content in messages[first:]]
    pairs = list(zip(turns[0::2], turns[1::2]))  # a last user message has no reply: it is left out
    if not pairs:
        raise Refused("no_assistant", "no assistant message follows a user message: nothing to train")
    return pairs, system
