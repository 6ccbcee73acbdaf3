"""Tools for templates without tool support: a standard tool prompt and a Hermes-style parser.

The model is shown its tools as JSON inside ``<tools>`` and asked to answer calls as
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; the same format renders earlier
calls back into history, so what the model sampled and what is re-rendered agree.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
OPEN_TAG = "<tool_call>"


def tool_system_prompt(tools: list[dict[str, Any]]) -> str:
    listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{listed}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def render_tool_calls(content: str, tool_calls: list[dict[str, Any]]) -> str:
    """An assistant message's text with its calls written back in the Hermes format."""
    blocks = []
    for call in tool_calls:
        function = call.get("function", {})
        arguments: Any = function.get("arguments", "{}")
        if isinstance(arguments, str):
            # Else rendered as the string given (nested past the recursion limit too).
            with contextlib.suppress(ValueError, RecursionError):
                arguments = json.loads(arguments)
        body = json.dumps(
            {"name": function.get("name"), "arguments": arguments}, ensure_ascii=False
        )
        blocks.append(f"<tool_call>\n{body}\n</tool_call>")
    return "\n".join([content, *blocks] if content else blocks)


def render_tool_result(content: str) -> str:
    return f"<tool_response>\n{content}\n</tool_response>"


@dataclass(frozen=True, slots=True)
class ParsedToolCalls:
    """A completion's text split into content and OpenAI-shaped tool calls; ``error`` says why
    a tool call did not parse; ``reasoning`` is the thinking before the content, where the
    template has any (``reasoning.ThinkTags``). Internal to building the turn: the answer is a
    ``ChatResult``."""

    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    reasoning: str | None = None


def parse_tool_calls(text: str) -> ParsedToolCalls:
    """Split Hermes ``<tool_call>`` blocks out of ``text``; on any bad block keep the text whole."""
    if OPEN_TAG not in text:
        return ParsedToolCalls(text)
    calls = []
    for match in _TOOL_CALL.finditer(text):
        call, error = _parse_block(match.group(1))
        if error is not None:
            return ParsedToolCalls(text, error=error)
        calls.append(call)
    if text.count(OPEN_TAG) != len(calls):
        return ParsedToolCalls(text, error="unterminated <tool_call> block")
    # Only the end is trimmed (the space before a call), as vLLM's Hermes parser keeps what
    # precedes the first call: text that starts the answer is content whether or not a call
    # follows, so a stream can send it before it knows.
    return ParsedToolCalls(_TOOL_CALL.sub("", text).rstrip(), calls)


def _parse_block(body: str) -> tuple[dict[str, Any], str | None]:
    try:
        payload = json.loads(body)
    except ValueError as exc:
        return {}, f"tool call is not JSON: {exc}"
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return {}, "tool call has no string 'name'"
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return {}, "tool call arguments are not JSON"
    if not isinstance(arguments, dict):
        return {}, "tool call arguments are not an object"
    return new_call(payload["name"], arguments), None


def new_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A parsed call as OpenAI's API answers it, with an id of its own."""
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }
