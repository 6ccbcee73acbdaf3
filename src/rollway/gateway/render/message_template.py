"""A chat template reduced to string pieces, for templates that write each message as
``prefix[role] + content + suffix[role]`` and end with a fixed generation prompt (ChatML and
its kin). Rendering a turn's new messages is then string concatenation instead of a Jinja run
over the whole conversation, the largest CPU cost of a gateway turn.

The pieces are read off the template by rendering sentinels, and then checked against the
template itself on probe conversations (whitespace at both ends, template syntax in content,
several roles in a row, repeated messages). A template that trims, escapes, numbers or looks at
neighbouring messages fails a probe and keeps the exact Jinja path: this is a shortcut only
where it gives the same text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rollway.generation import Message

Render = Callable[[list[Message], bool], str]

_CONTENT = "rollwaycontentsentinel"
ROLES = ("system", "user", "assistant", "tool")
_PROBE_TEXTS = (
    "  two leading spaces and a trailing newline\n",
    "{{ not a variable }} {% raw %} \\n 'quotes' \"double\" <b>tags</b>",
    "",
    "émoji ✓ and 中文\n\nparagraphs",
    "<think>reasoning</think>the answer",
)


@dataclass(frozen=True, slots=True)
class MessagePieces:
    """What the template writes around each role's content, and for the generation prompt."""

    prefix: dict[str, str]
    suffix: dict[str, str]
    generation_prompt: str

    def render(self, messages: Sequence[Message]) -> str:
        """The template's text for ``messages`` (prepared: role and text content only)
        appended to a conversation, followed by the generation prompt."""
        parts = [
            f"{self.prefix[m['role']]}{m['content']}{self.suffix[m['role']]}" for m in messages
        ]
        parts.append(self.generation_prompt)
        return "".join(parts)


def read_pieces(base: list[Message], render: Render) -> MessagePieces | None:
    """The template's pieces after the conversation ``base``, or None when the template is not
    of this shape. ``render(messages, add_generation_prompt)`` runs the real template."""
    head = render(base, False)
    prefix: dict[str, str] = {}
    suffix: dict[str, str] = {}
    for role in ROLES:
        try:
            text = render([*base, {"role": role, "content": _CONTENT}], False)
        except Exception:  # a template may refuse a role (e.g. no tool role): not this shape
            return None
        if not text.startswith(head) or text.count(_CONTENT) != 1:
            return None
        prefix[role], _, suffix[role] = text[len(head) :].partition(_CONTENT)
    with_prompt = render(base, True)
    if not with_prompt.startswith(head):
        return None
    pieces = MessagePieces(prefix, suffix, with_prompt[len(head) :])
    return pieces if _agrees(pieces, base, head, render) else None


def _agrees(pieces: MessagePieces, base: list[Message], head: str, render: Render) -> bool:
    probes: list[list[Message]] = [
        [{"role": role, "content": text} for role in ROLES] for text in _PROBE_TEXTS
    ]
    probes.append([{"role": "tool", "content": "same"}, {"role": "tool", "content": "same"}])
    probes.append([{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}])
    for messages in probes:
        try:
            text = render([*base, *messages], True)
        except Exception:
            return False
        if text != head + pieces.render(messages):
            return False
    return True
