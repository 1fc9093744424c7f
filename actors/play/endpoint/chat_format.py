"""OpenAI chat messages as the model's chat format: requests checked, messages rendered in ChatML with
Hermes-style tools (the format of Qwen models and of the tiny model), tool calls parsed from generated text.

Rendering is per message, so an episode's context grows by the new messages' text only and the tokens the
model generated are never re-tokenised (actors/play/endpoint/episode.py). Conventions, as in Qwen2.5's template:
- the tools go into the system message: its content, a blank line, then `<tools>` with one JSON function
  signature a line and `</tools>` (a system message of just that when the caller sent none);
- an assistant's tool calls are `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` after its text;
- a `tool` message is a user turn holding `<tool_response>\\n...\\n</tool_response>`.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

ROLES = ("system", "user", "assistant", "tool")
TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


class BadRequest(ValueError):
    """A request the endpoint cannot serve; `reason` is the metric label, the message goes to the caller."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Message:
    """A chat message reduced to what the chat format shows: two messages that render alike are equal."""
    role: str
    content: str
    tool_calls: tuple[tuple[str, str], ...] = ()  # (name, arguments as canonical JSON)


@dataclass
class ChatRequest:
    messages: list[Message]
    tools: list[dict] = field(default_factory=list)  # the functions' signatures as the caller sent them
    temperature: float | None = None
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    tool_choice: str | dict = "auto"
    stream: bool = False  # answer as server-sent chat.completion.chunk events
    include_usage: bool = False  # stream_options.include_usage: a last event with the usage
    min_tokens: int = 0  # vLLM's extra parameter: no end of turn before this many tokens


def _text(content) -> str:
    """A message's content: a string, null, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise BadRequest("bad_content", "message content must be a string or a list of text parts")


def _canonical_arguments(arguments) -> str:
    """Arguments as one canonical JSON text, so that a caller re-serialising them still matches."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments  # the model's own malformed arguments, echoed back as they were
    return json.dumps(arguments, sort_keys=True)


def parse_message(raw) -> Message:
    if not isinstance(raw, dict) or raw.get("role") not in ROLES:
        raise BadRequest("bad_message", f"each message needs a role among {', '.join(ROLES)}")
    calls = []
    for call in raw.get("tool_calls") or []:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise BadRequest("bad_tool_call", "a tool call needs function.name and function.arguments")
        calls.append((fn["name"], _canonical_arguments(fn.get("arguments", "{}"))))
    return Message(raw["role"], _text(raw.get("content")), tuple(calls))


def _number(body: dict, key: str, kind, low: float, high: float):
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise BadRequest(f"bad_{key}", f"{key} must be a number in [{low}, {high}]")
    return kind(value)


def parse_request(body) -> ChatRequest:
    """A /v1/chat/completions body, or BadRequest naming what is wrong."""
    if not isinstance(body, dict):
        raise BadRequest("bad_json", "the body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("no_messages", "messages must be a non-empty list")
    stream, options = body.get("stream") or False, body.get("stream_options") or {}
    if not isinstance(stream, bool) or not isinstance(options, dict):
        raise BadRequest("bad_stream", "stream must be a boolean and stream_options an object")
    if body.get("n", 1) != 1:
        raise BadRequest("bad_n", "n must be 1: every call is one turn of the episode")
    tools = body.get("tools") or []
    if not isinstance(tools, list) or not all(isinstance(t, dict) and isinstance(t.get("function"), dict)
                                              and isinstance(t["function"].get("name"), str) for t in tools):
        raise BadRequest("bad_tools", "tools must be a list of {type: function, function: {name, ...}}")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("bad_stop", "stop must be a string or a list of non-empty strings")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return ChatRequest([parse_message(m) for m in messages], [t["function"] for t in tools],
                       _number(body, "temperature", float, 0.0, 2.0),
                       None if max_tokens is None else _number({"max_tokens": max_tokens}, "max_tokens", int, 1, 1 << 20),
                       stop, body.get("tool_choice") or "auto", stream, bool(options.get("include_usage")),
                       _number(body, "min_tokens", int, 0, 1 << 20) or 0)


def tools_block(tools: list[dict]) -> str:
    return "<tools>\n" + "\n".join(json.dumps(t, sort_keys=True) for t in tools) + "\n</tools>"


def render(messages: list[Message], tools: list[dict], *, first: bool) -> str:
    """The chat-format text of `messages`; `first`: they open the conversation (the tools go there)."""
    parts = []
    if first and tools:
        if messages and messages[0].role == "system":
            messages = [Message("system", f"{messages[0].content}\n\n{tools_block(tools)}"), *messages[1:]]
        else:
            messages = [Message("system", tools_block(tools)), *messages]
    for m in messages:
        if m.role == "tool":
            parts.append(f"<|im_start|>user\n<tool_response>\n{m.content}\n</tool_response><|im_end|>\n")
            continue
        calls = "".join(f"\n<tool_call>\n{{\"name\": {json.dumps(name)}, \"arguments\": {args}}}\n</tool_call>"
                        for name, args in m.tool_calls)
        parts.append(f"<|im_start|>{m.role}\n{m.content}{calls}<|im_end|>\n")
    return "".join(parts)


def parse_tool_calls(text: str) -> tuple[str, list[tuple[str, str]]]:
    """(the text outside the tool calls, [(name, arguments JSON)]) of generated text; a block that is not
    `{"name": str, "arguments": object}` JSON stays in the text."""
    calls, kept, last = [], [], 0
    for match in TOOL_CALL.finditer(text):
        try:
            call = json.loads(match.group(1))
            name, arguments = call["name"], call.get("arguments", {})
            if not isinstance(name, str) or not isinstance(arguments, dict):
                raise ValueError
        except (ValueError, KeyError, TypeError):
            continue
        kept.append(text[last:match.start()])
        last = match.end()
        calls.append((name, json.dumps(arguments, sort_keys=True)))
    kept.append(text[last:])
    return "".join(kept).strip() if calls else text, calls


def forced_tool(request: ChatRequest) -> dict | None:
    """The signature of the function `tool_choice` names (or of the only tool, for "required"); None: free."""
    choice = request.tool_choice
    if choice in ("auto", "none"):
        return None
    names = {t["name"]: t for t in request.tools}
    if choice == "required" and len(names) == 1:
        return next(iter(names.values()))
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if name not in names:
        raise BadRequest("bad_tool_choice", "tool_choice must be auto, none, required (with one tool) or "
                         "{type: function, function: {name}} naming one of the tools")
    return names[name]


def tool_call_constraint(tool: dict) -> dict:
    """vLLM structured outputs that make the model write one call of `tool` in the Hermes format."""
    schema = {"type": "object", "properties": {"name": {"const": tool["name"]},
                                               "arguments": tool.get("parameters") or {"type": "object"}},
              "required": ["name", "arguments"], "additionalProperties": False}
    # at most one whitespace character in a row: JSON's free whitespace otherwise lets a weak model spend
    # every token it has on blanks (a random tiny model does)
    content = {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": 1}
    return {"structural_tag": json.dumps({"type": "structural_tag", "format": {
        "type": "tag", "begin": "<tool_call>\n", "content": content, "end": "\n</tool_call>"}})}
