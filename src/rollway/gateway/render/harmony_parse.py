"""A GPT-OSS answer read by its harmony channels: ``analysis`` is the reasoning, ``final`` (and
``commentary`` to no one: a preamble) the content, ``commentary`` to ``functions.NAME`` a
tool call whose body is its JSON arguments.

The answer's text keeps harmony's structural tokens (the renderer's ``stop_ids`` are only the
ids that end a turn), and follows the generation prompt ``<|start|>assistant``::

    <|channel|>analysis<|message|>...<|end|>
    <|start|>assistant<|channel|>commentary to=functions.add <|constrain|>json<|message|>{...}

(the stop token, ``<|call|>`` or ``<|return|>``, already cut). A call that does not parse, or a
message of a shape harmony does not have, keeps the text whole with ``error`` set: flagged,
never guessed. ``HarmonyChannels`` gives a stream the same split as the tokens come.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from rollway.gateway.render.reasoning import ThinkTags
from rollway.gateway.render.tool_calls import ParsedToolCalls

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
_RECIPIENT = re.compile(r"to=([^\s<]+)")
#: Between two channels' texts, in the reasoning and in the content.
JOIN = "\n\n"


@dataclass(frozen=True, slots=True)
class Block:
    """One harmony message of an answer: its header's channel and recipient, its body."""

    channel: str | None
    recipient: str | None
    body: str
    closed: bool


def read_blocks(text: str, ended: bool = False) -> tuple[list[Block], str | None]:
    """The answer's messages, and why the text is not harmony where it is not (the blocks read
    until there). The last message may be open: a stream's, or one its stop token ended. Its
    header may be unfinished unless the answer ``ended`` (by a stop token)."""
    blocks: list[Block] = []
    pieces = text.split(START)
    for at, piece in enumerate(pieces):
        if at > 0 and not blocks[-1].closed:
            return blocks, "a message starts before the previous one ended (<|end|>)"
        header, found, body = piece.partition(MESSAGE)
        if not found:
            if at == len(pieces) - 1 and not ended:
                break  # a header still coming (or cut): not a message yet
            return blocks, "a message header without <|message|>"
        closed = body.endswith(END)
        body = body[: -len(END)] if closed else body
        if END in body or MESSAGE in body:
            return blocks, "text after a message's <|end|> outside any message"
        channel = header.partition(CHANNEL)[2].split()
        recipient = _RECIPIENT.search(header)
        blocks.append(
            Block(
                channel[0] if channel else None,
                recipient.group(1) if recipient else None,
                body,
                closed,
            )
        )
    return blocks, None


def parse_harmony(text: str, use_tools: bool, end: str | None = None) -> ParsedToolCalls:
    """An answer's text (its stop token ``end`` cut; None where none ended it) as reasoning,
    content and tool calls. Text with no message header at all is flagged: harmony's parser
    (vLLM's) reads it as a header that never ends, and answers nothing."""
    if not text:
        return ParsedToolCalls(text)
    blocks, error = read_blocks(text, ended=end is not None)
    reasoning = [b.body for b in blocks if b.channel == "analysis" and b.recipient is None]
    thought = JOIN.join(reasoning) if reasoning else None
    if error is None and not blocks:
        error = "no harmony message: no header ending in <|message|>"
    if error is None:
        error = _misended(blocks[-1], end)
    if error is not None:
        return ParsedToolCalls(text, error=error, reasoning=thought)
    content: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in blocks:
        if block.recipient is not None:
            call, error = _call(block, use_tools)
            if call is None:
                return ParsedToolCalls(text, error=error, reasoning=thought)
            calls.append(call)
        elif block.channel in ("final", "commentary"):
            content.append(block.body)
        elif block.channel != "analysis":
            why = f"a message on channel {block.channel!r}, not analysis, commentary or final"
            return ParsedToolCalls(text, error=why, reasoning=thought)
    return ParsedToolCalls(JOIN.join(content), calls, reasoning=thought)


def _misended(last: Block, end: str | None) -> str | None:
    """Why the stop token does not fit the answer's last message: a call ends at
    ``<|call|>``, any other message at ``<|return|>`` (None where it fits, or none ended it)."""
    if last.recipient is not None and end == "<|return|>":
        return "a tool call ended by <|return|>, not <|call|>"
    if last.recipient is None and end == "<|call|>":
        return f"a message on channel {last.channel!r}, not a tool call, ended by <|call|>"
    return None


def _call(block: Block, use_tools: bool) -> tuple[dict[str, Any] | None, str]:
    recipient = block.recipient or ""
    if not recipient.startswith("functions.") or recipient == "functions.":
        return None, f"a message to {recipient!r}, which is not a function (functions.NAME)"
    if not use_tools:
        return None, f"a call to {recipient!r}, but no tools were offered"
    try:
        arguments = json.loads(block.body)
    except (ValueError, RecursionError) as exc:
        return None, f"tool call arguments are not JSON: {exc}"
    if not isinstance(arguments, dict):
        return None, "tool call arguments are not an object"
    call = {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {
            "name": recipient.removeprefix("functions."),
            "arguments": json.dumps(arguments, ensure_ascii=False),
        },
    }
    return call, ""


def call_recipients(text: str) -> list[str]:
    """The functions an answer called, in order (their names, ``functions.`` cut)."""
    blocks, _ = read_blocks(text)
    return [
        b.recipient.removeprefix("functions.")
        for b in blocks
        if b.recipient is not None and b.recipient.startswith("functions.")
    ]


@dataclass(frozen=True, slots=True)
class HarmonyChannels(ThinkTags):
    """Harmony's channels where ``ThinkTags`` has tags: what a stream shows of an answer as its
    tokens come (``turn_stream.TurnText``), as ``parse_harmony`` will split it. Special tokens
    come whole, so a message's header is either all there or not begun."""

    def split(self, text: str) -> tuple[str | None, str]:
        parsed = parse_harmony(text, use_tools=True)
        return parsed.reasoning, parsed.content

    def shown(self, text: str) -> str | None:
        if MESSAGE not in text:
            return None  # not harmony, or not yet: the parse decides at the end
        blocks, _ = read_blocks(text)
        content = [b.body for b in blocks if b.recipient is None and b.channel != "analysis"]
        return JOIN.join(content) if content else None

    def reasoning_shown(self, text: str) -> str:
        blocks, _ = read_blocks(text)
        return JOIN.join(b.body for b in blocks if b.channel == "analysis" and not b.recipient)
