"""DeepSeek V3: its own markers for turns, tool calls and tool results, rendered in Python.

The format (``<｜User｜>``, ``<｜Assistant｜>``, an answer closed by ``<｜end▁of▁sentence｜>``)::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
    ```json
    ARGUMENTS
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>

calls apart by a newline, and a run of tool results as ``<｜tool▁outputs▁begin｜>``, each
``<｜tool▁output▁begin｜>RESULT<｜tool▁output▁end｜>`` (apart by a newline), then
``<｜tool▁outputs▁end｜>``; the answer after them follows with no ``<｜Assistant｜>``.

The released template (the one the tokenizer ships) writes chats right but not tool calls: a
lone call is never closed, later calls lose their opening markers, later results theirs, and
a call with content is dropped. So the renderer writes the format itself: as the released
template does where it is well formed (chats, a first round of two calls and their results),
and as DeepSeek's later templates, vLLM's DeepSeek V3 tool template and the ``renderers``
package do past it (``renderers`` alone writes no newline between two calls or two results).
The template has no place for tool definitions: they are shown after the system prompt, as
JSON in ``<tools>`` with the call format in DeepSeek's markers, as vLLM's V3 tool template
shows them. A system message after the first turn is shown as a user's, as ``renderers``
shows it (the template would move it up to the first, rewriting the history). No message is
written differently once later ones follow, so a turn's new messages extend the sampled ids
as they are. DeepSeek V3 writes no reasoning (R1's ``<think>`` is another family's).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from rollway.errors import InvalidFieldsError
from rollway.gateway.render.chat_template import ChatRenderer, content_text
from rollway.gateway.render.template_marks import family_hint
from rollway.gateway.render.tool_calls import ParsedToolCalls
from rollway.generation import Message

USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
OUTPUTS_BEGIN = "<｜tool▁outputs▁begin｜>"
OUTPUTS_END = "<｜tool▁outputs▁end｜>"
OUTPUT_BEGIN = "<｜tool▁output▁begin｜>"
OUTPUT_END = "<｜tool▁output▁end｜>"
#: Each is one token of DeepSeek V3's vocabulary (not a special one: it is text when decoded).
MARKERS: tuple[str, ...] = (USER, ASSISTANT, CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP)
MARKERS += (OUTPUTS_BEGIN, OUTPUTS_END, OUTPUT_BEGIN, OUTPUT_END)

_FENCE_OPEN, _FENCE_CLOSE = "\n```json\n", "\n```"
#: One call as the template writes it (its end marker already cut off).
_CALL = re.compile(
    re.escape(CALL_BEGIN) + r"(?P<type>[^\n]*?)" + re.escape(SEP) + r"(?P<name>[^\n]*)"
    r"\n```json\n(?P<arguments>.*)\n```",
    re.DOTALL,
)


class DeepSeekV3Renderer(ChatRenderer):
    """DeepSeek V3 (``deepseek_v3``): calls and results in its markers, tools shown after the
    system prompt, no reasoning. Refused on a tokenizer or template not of that shape (R1's,
    which writes ``<think>``, included) rather than rendering as another family would."""

    name = "deepseek_v3"
    tool_call_open = CALLS_BEGIN

    def __init__(self, tokenizer: Any) -> None:
        _check_family(tokenizer)
        super().__init__(tokenizer)
        # Its own render below: neither the template's pieces nor its message shapes.
        self._pieces = None
        self._shapes = None

    def render(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
    ) -> str:
        prepared = [_prepared(m) for m in messages]
        lead = next((i for i, m in enumerate(prepared) if m["role"] != "system"), len(prepared))
        system = [m["content"] for m in prepared[:lead]] + (
            [self.tool_prompt(tools)] if tools else []
        )
        start = (self.tokenizer.bos_token or "") + "\n\n".join(system)
        return start + self._turns(prepared[lead:], None, add_generation_prompt)

    def continuation_ids(
        self,
        completion_ids: list[int],
        new_messages: list[Message],
        tools: list[dict[str, Any]] | None,
        max_tokens: int | None = None,
        keep_sampled: bool = True,
    ) -> list[int] | None:
        """The closing glue and the new messages' text: the format writes no message
        differently once later ones follow, so the history is as sampled either way."""
        new = self._turns([_prepared(m) for m in new_messages], "assistant", True)
        return self.encode(self.closing_glue(completion_ids) + new, max_tokens)

    def parse_tool_calls(self, text: str) -> ParsedToolCalls:
        return parse_deepseek_calls(text)

    def tool_prompt(self, tools: list[dict[str, Any]]) -> str:
        listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{listed}\n</tools>\n\n"
            f"To call functions, write {CALLS_BEGIN}, then each call on a line of its own as\n"
            f"{CALL_BEGIN}function{SEP}<function-name>{_FENCE_OPEN}<args-json-object>"
            f"{_FENCE_CLOSE}{CALL_END}\nthen {CALLS_END}."
        )

    def tool_calls_text(self, content: str, tool_calls: list[dict[str, Any]]) -> str:
        return content + CALLS_BEGIN + "\n".join(map(_call_text, tool_calls)) + CALLS_END

    def tool_result_text(self, content: str) -> str:
        return OUTPUT_BEGIN + content + OUTPUT_END

    def _turns(self, messages: list[Message], previous: str | None, prompt: bool) -> str:
        """The messages after the system prompt; ``previous`` the role before them, ``prompt``
        whether the model answers next (its ``<｜Assistant｜>``, none after tool results)."""
        parts: list[str] = []
        for at, message in enumerate(messages):
            role, content = message["role"], message["content"]
            if role in ("user", "system"):  # a system message past the first ones: a user's
                parts += [USER, content]
            elif role == "assistant":
                calls = message.get("tool_calls")
                parts += [ASSISTANT] if previous != "tool" else []
                parts += [self.tool_calls_text(content, calls) if calls else content]
                parts += [self.eos_text]
            elif role == "tool":
                parts.append(OUTPUTS_BEGIN if previous != "tool" else "\n")
                parts.append(self.tool_result_text(content))
                following = messages[at + 1]["role"] if at + 1 < len(messages) else None
                parts += [OUTPUTS_END] if following != "tool" else []
            else:
                raise InvalidFieldsError(
                    f"message role {role!r} is not one of system, user, assistant, tool",
                    param="messages",
                )
            previous = role
        if prompt and previous != "tool":
            parts.append(ASSISTANT)
        return "".join(parts)


def parse_deepseek_calls(text: str) -> ParsedToolCalls:
    """Split DeepSeek V3's calls section out of ``text``: the content is what precedes it, as
    sampled (vLLM's parser keeps it so too, and written back it is the model's own text); on
    any malformed call the text is kept whole and ``error`` says why."""
    at = text.find(CALLS_BEGIN)
    if at < 0:
        stray = next((m for m in (CALL_BEGIN, CALL_END, SEP, CALLS_END) if m in text), None)
        if stray is not None:
            return ParsedToolCalls(text, error=f"{stray} outside a {CALLS_BEGIN} section")
        return ParsedToolCalls(text)
    section, closed, after = text[at + len(CALLS_BEGIN) :].partition(CALLS_END)
    if not closed:
        return ParsedToolCalls(text, error=f"unterminated tool calls: no {CALLS_END}")
    if after.strip():
        return ParsedToolCalls(text, error=f"text after {CALLS_END}")
    calls, error = _parse_section(section)
    if error is not None:
        return ParsedToolCalls(text, error=error)
    return ParsedToolCalls(text[:at], calls)


def _parse_section(section: str) -> tuple[list[dict[str, Any]], str | None]:
    calls: list[dict[str, Any]] = []
    rest = section.strip()
    while rest:
        block, closed, rest = rest.partition(CALL_END)
        if not closed:
            return [], f"unterminated tool call: no {CALL_END}"
        call, error = _parse_call(block)
        if error is not None:
            return [], error
        calls.append(call)
        rest = rest.lstrip()
    if not calls:
        return [], "a tool calls section without calls"
    return calls, None


def _parse_call(block: str) -> tuple[dict[str, Any], str | None]:
    match = _CALL.fullmatch(block)
    if match is None:
        return {}, (
            f"tool call is not {CALL_BEGIN}function{SEP}NAME, a ```json fence and its end: "
            f"{block[:80]!r}"
        )
    if match["type"] != "function":
        return {}, f"tool call type is {match['type']!r}, not 'function'"
    name = match["name"]
    if not name or name != name.strip() or any(m in name for m in MARKERS):
        return {}, f"tool call name {name!r} is not a function name"
    arguments = match["arguments"]
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError) as exc:
        return {}, f"tool call arguments are not JSON: {exc}"
    if not isinstance(value, dict):
        return {}, "tool call arguments are not an object"
    # The arguments as sampled: written back, they are the model's own text.
    call = {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
    return call, None


def _call_text(call: dict[str, Any]) -> str:
    function = call.get("function") or {}
    arguments = function.get("arguments", "{}")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    kind = call.get("type") or "function"
    name = function.get("name", "")
    return f"{CALL_BEGIN}{kind}{SEP}{name}{_FENCE_OPEN}{arguments}{_FENCE_CLOSE}{CALL_END}"


def _prepared(message: Message) -> Message:
    role = "system" if message["role"] == "developer" else message["role"]
    prepared: Message = {"role": role, "content": content_text(message.get("content"))}
    if message.get("tool_calls"):
        prepared["tool_calls"] = message["tool_calls"]
    return prepared


def _check_family(tokenizer: Any) -> None:
    template = str(tokenizer.chat_template or "")
    single = all(len(tokenizer.encode(m, add_special_tokens=False)) == 1 for m in MARKERS)
    if not single or CALLS_BEGIN not in template or "<think>" in template:
        raise InvalidFieldsError(
            f"renderer 'deepseek_v3': the tokenizer and chat template of "
            f"{tokenizer.name_or_path!r} are not DeepSeek V3's (its template writes "
            f"{CALLS_BEGIN} calls and no <think> reasoning, its vocabulary has the tool "
            f"markers as tokens); {family_hint(tokenizer, 'deepseek_v3')}",
            param="renderer",
        )
