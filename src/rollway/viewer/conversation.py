"""A rollout's whole conversation, segment by segment, from what its record holds.

The trajectory keeps the structured messages of its last request only (``messages``: that
request and the reply), which are the conversation of the last turn's segment. A folded
agent's earlier segments (the history was rewritten: folded, summarised, trimmed) are rebuilt
from their turns: the segment's first prompt, as the chat template rendered it, then each
turn's reply as the agent got it (content, tool calls), with the prompt ids the next turn added
between them (template glue, tool results, user text). Prompts are shown as their ids decoded,
which is exactly what the model read; parsing messages back out of a render would be a guess.

In the structured messages, each assistant message is matched to the turn that sampled it
(same content and tool calls, latest first); one with no recorded turn behind it (a few-shot
example the agent wrote, an answer it made up) is marked as not sampled.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from rollway.trajectory import Trajectory, Turn

#: Token ids to text (None: no tokenizer loads, or these ids are not its).
Decode = Callable[[list[int]], str | None]


def conversation(trajectory: Trajectory, decode: Decode) -> list[dict[str, Any]]:
    """One entry per segment, in order: ``segment``, its ``turns`` (indices) and either
    ``messages`` (the last request's, each with the turn that sampled it) or ``parts`` (a
    segment rebuilt from its turns: ``prompt``, ``reply`` and ``between`` parts)."""
    turns = trajectory.turns
    structured = turns[-1].segment if turns else 0
    by_segment: dict[int, list[Turn]] = {structured: []}
    for turn in turns:
        by_segment.setdefault(turn.segment, []).append(turn)
    segments = []
    for segment in sorted(by_segment):
        own = by_segment[segment]
        entry: dict[str, Any] = {"segment": segment, "turns": [t.index for t in own]}
        if segment == structured:
            entry["messages"] = annotated(trajectory.messages, turns)
        else:
            entry["parts"] = rebuilt(own, decode)
        segments.append(entry)
    return segments


def annotated(messages: list[dict[str, Any]], turns: list[Turn]) -> list[dict[str, Any]]:
    """Each message with the turn that sampled it (``turn``, ``turn_segment``: None for what
    the model did not write) and ``not_sampled``: an assistant message no turn recorded."""
    sampled = sampled_by(messages, turns)
    return [
        {
            "message": message,
            "turn": turn.index if turn else None,
            "turn_segment": turn.segment if turn else None,
            "not_sampled": message.get("role") == "assistant" and turn is None,
        }
        for message, turn in zip(messages, sampled, strict=True)
    ]


def sampled_by(messages: list[dict[str, Any]], turns: list[Turn]) -> list[Turn | None]:
    """The turn behind each assistant message, matched from the end: the reply closing the
    conversation is the last turn's, and each earlier one an earlier turn's. A message that
    matches no turn before the one matched after it was not sampled."""
    found: list[Turn | None] = [None] * len(messages)
    end = len(turns)
    for position in range(len(messages) - 1, -1, -1):
        message = messages[position]
        if message.get("role") != "assistant":
            continue
        for candidate in range(end - 1, -1, -1):
            if _same_reply(message, turns[candidate]):
                found[position], end = turns[candidate], candidate
                break
    return found


def _same_reply(message: dict[str, Any], turn: Turn) -> bool:
    return _text(message.get("content")) == _text(turn.content) and _calls(
        message.get("tool_calls")
    ) == _calls(turn.tool_calls)


def _text(content: Any) -> str:
    """A message's text: content parts (``[{"type": "text", ...}]``) joined."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return str(content)


def _calls(calls: Any) -> list[tuple[Any, Any]]:
    """Tool calls as (name, arguments): ids and extra fields an SDK adds do not matter."""
    named = []
    for call in calls or ():
        function = call.get("function", {}) if isinstance(call, dict) else {}
        named.append((function.get("name"), _arguments(function.get("arguments"))))
    return named


def _arguments(arguments: Any) -> Any:
    """Arguments as a value: a JSON text and the object an agent parsed it into are alike."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def rebuilt(turns: list[Turn], decode: Decode) -> list[dict[str, Any]]:
    """A segment from its turns: its first prompt, then each reply, with the prompt ids the
    next turn added between them. ``tokens`` counts the ids; ``text`` is None where they are
    not decoded (no tokenizer) or not recorded (a chat-level engine records no ids)."""
    parts: list[dict[str, Any]] = []
    for k, turn in enumerate(turns):
        ids = turn.new_prompt_ids
        parts.append(
            {
                "kind": "between" if k else "prompt",
                "tokens": len(ids) if k else turn.prompt_len,
                "text": decode(ids) if ids else None,
            }
        )
        parts.append(
            {
                "kind": "reply",
                "turn": turn.index,
                "finish_reason": turn.finish_reason,
                "message": {
                    "role": "assistant",
                    "content": turn.content,
                    "tool_calls": turn.tool_calls,
                },
            }
        )
    return parts
