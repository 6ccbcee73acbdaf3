"""A turn's new messages rendered by their shape, for templates the string pieces of
``message_template`` do not fit (Qwen3's: it writes tools into the system prompt, groups tool
results into one user turn, and renders an answer by its position).

The template's text for a sequence of roles (tool, tool; or user) is rendered once with
placeholders for the contents, then each turn's text is the placeholders replaced: string work
instead of a Jinja run over the conversation and its tool definitions. A shape is used only
after the template gave the same text as the replaced placeholders for probe contents
(whitespace at both ends, template syntax, tags, empty), so a template that trims, escapes or
looks at a content keeps its exact path; the caller audits real turns now and then as well.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rollway.generation import Message

#: ``tail(messages)``: the template's text for these new messages after a conversation (and
#: the generation prompt), or None where it has none.
Tail = Callable[[list[Message]], str | None]
#: A rendered shape: literal text, and between each two the index of the field (in
#: ``_fields`` order) whose value goes there.
Skeleton = tuple[tuple[str, ...], tuple[int, ...]]

_SLOT = "rollwayslot{}x"
_ROLES = frozenset({"user", "tool", "system"})
#: The fields a shape's messages may have; their values are slots.
_SLOTTED = ("content", "tool_call_id")
_PROBES = (
    "  two leading spaces and a trailing newline\n",
    "{{ not a variable }} {% raw %} 'quotes' \"double\" <tool_response>",
    "",
    "</tool_response> émoji ✓\n\nparagraphs",
)
#: Shapes kept per tools block: a tool loop uses few (one result, two, a question).
MAX_SHAPES = 256


class MessageShapes:
    """Skeletons of the shapes seen, for one tools block (``tail`` renders with it)."""

    def __init__(self, tail: Tail) -> None:
        self._tail = tail
        self._skeletons: dict[tuple[Any, ...], Skeleton | None] = {}

    def render(self, messages: Sequence[Message]) -> str | None:
        """The template's text for ``messages``, or None where their shape has no skeleton
        (a field besides role, content and tool_call_id; an unverified or refused shape)."""
        shape = _shape(messages)
        if shape is None:
            return None
        values = _fields(messages)
        if any("rollwayslot" in value for value in values):
            return None  # a value that looks like a placeholder would be replaced
        if shape not in self._skeletons:
            if len(self._skeletons) >= MAX_SHAPES:
                return None
            self._skeletons[shape] = self._skeleton(messages)
        skeleton = self._skeletons[shape]
        return None if skeleton is None else _fill(skeleton, values)

    def _skeleton(self, messages: Sequence[Message]) -> Skeleton | None:
        count = len(_fields(messages))
        slots = [_SLOT.format(at) for at in range(count)]
        text = self._tail(_with_fields(messages, slots))
        if text is None or any(text.count(slot) > 1 for slot in slots):
            return None
        contents = [at for at, (_, name) in enumerate(_names(messages)) if name == "content"]
        if any(slots[at] not in text for at in contents):
            return None  # a template that leaves a content out is not rendering it as given
        order = sorted(
            (at for at in range(count) if slots[at] in text), key=lambda at: text.index(slots[at])
        )
        texts, rest = [], text
        for at in order:
            before, _, rest = rest.partition(slots[at])
            texts.append(before)
        texts.append(rest)
        skeleton: Skeleton = (tuple(texts), tuple(order))
        for number, probe in enumerate(_PROBES):
            values = [
                probe if name == "content" else f"call_probe{number}_{at}"
                for at, (_, name) in enumerate(_names(messages))
            ]
            if self._tail(_with_fields(messages, values)) != _fill(skeleton, values):
                return None
        return skeleton


def _shape(messages: Sequence[Message]) -> tuple[Any, ...] | None:
    """What the skeleton of ``messages`` depends on: each role and which fields it has."""
    shape = []
    for message in messages:
        if message.get("role") not in _ROLES or set(message) - {"role", *_SLOTTED}:
            return None
        if not all(isinstance(message[name], str) for name in _SLOTTED if name in message):
            return None
        shape.append((message["role"], "tool_call_id" in message))
    return tuple(shape)


def _names(messages: Sequence[Message]) -> list[tuple[int, str]]:
    """Each slotted field of ``messages``, as (message index, field name), in order."""
    return [(at, name) for at, m in enumerate(messages) for name in _SLOTTED if name in m]


def _fields(messages: Sequence[Message]) -> list[str]:
    return [messages[at][name] for at, name in _names(messages)]


def _with_fields(messages: Sequence[Message], values: list[str]) -> list[Message]:
    """``messages`` with their slotted fields set to ``values`` (in ``_names`` order)."""
    out = [dict(m) for m in messages]
    for (at, name), value in zip(_names(messages), values, strict=True):
        out[at][name] = value
    return out


def _fill(skeleton: Skeleton, values: list[str]) -> str:
    texts, order = skeleton
    parts = [texts[0]]
    for at, slot in enumerate(order):
        parts += [values[slot], texts[at + 1]]
    return "".join(parts)
