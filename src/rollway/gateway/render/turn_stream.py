"""A streamed turn's text, as the tokens come: what may be shown to the client now.

``TurnText`` decodes tokens incrementally and holds back what the recorded turn might not keep:
an incomplete character, any special token (``TokenTurns._parse`` leaves them out of the text:
they are not text), text that could begin a stop string, and, when tools are offered,
everything from where the renderer's tool-call tag (``<tool_call>``) could begin plus the
whitespace before it (the parse trims the content's end). Tool calls are handed out once the
whole answer is parsed: a later bad block makes the parse keep the text whole, so a call sent
earlier could turn out not to exist. At the end, ``rest`` gives what the recorded content adds
to what was sent, so the deltas always add up to it. Where the template writes reasoning
(``reasoning.ThinkTags``), the content waits until the reasoning closes, and the reasoning
streams apart (``ReasoningDelta``), held back where the closing tag, the newlines the parse
strips or a stop string might begin (the recorded turn is cut at a stop string inside the
reasoning too).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from rollway.engines.whole_text import WholeText
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.gateway.render.reasoning import ThinkTags
from rollway.generation import ChatResult

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ContentDelta:
    """Text of the answer's content, in order: the deltas of a turn add up to its content."""

    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """Text of the answer's reasoning (``reasoning_content``), in order, before its content:
    the deltas of a turn add up to its reasoning."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """One whole tool call of the answer, as recorded (OpenAI-shaped)."""

    index: int
    call: dict[str, Any]


#: What a streamed turn hands out: deltas, then the ``ChatResult`` (always last).
TurnPiece = ContentDelta | ReasoningDelta | ToolCallDelta | ChatResult


def closing_pieces(
    result: ChatResult, sent: str = "", reasoning_sent: str = ""
) -> Iterator[TurnPiece]:
    """The end of a streamed turn: the reasoning and the content not yet sent, each tool
    call, the result."""
    reasoning = result.message.get("reasoning_content") or ""
    if not reasoning.startswith(reasoning_sent):
        log.warning("a streamed answer's reasoning differs from its recorded reasoning")
    elif len(reasoning) > len(reasoning_sent):
        yield ReasoningDelta(reasoning[len(reasoning_sent) :])
    content = result.message.get("content") or ""
    if not content.startswith(sent):  # a tokenizer whose decoding is not prefix-stable
        log.warning("a streamed answer's text differs from its recorded content")
    elif len(content) > len(sent):
        yield ContentDelta(content[len(sent) :])
    for index, call in enumerate(result.message.get("tool_calls") or []):
        yield ToolCallDelta(index, call)
    yield result


class TurnText:
    """The shown text of one streamed answer. ``push`` takes the next tokens and returns the
    content now safe to show; ``sent`` is all it showed. With ``thinking``, the reasoning
    before the content is shown apart: ``take_reasoning`` after each ``push`` gives what is
    new of it, ``reasoning_sent`` is all it gave."""

    def __init__(
        self,
        renderer: ChatRenderer,
        stop: Sequence[str],
        tools: bool,
        special_ids: frozenset[int],
        thinking: ThinkTags | None = None,
    ) -> None:
        self._stops = [s for s in stop if s]
        self._holds = self._stops + ([renderer.tool_call_open] if tools else [])
        # Where the first stop string begins, once found; the text before ``_searched`` has
        # none that ends there.
        self._stop_at: int | None = None
        self._searched = 0
        self._tools = tools
        self._special_ids = special_ids
        # The content starts after the reasoning: nothing is shown before (``ThinkTags.shown``).
        self._thinking = thinking
        self.reasoning_sent = ""
        # With the renderer's own decode: the text the recorded turn is parsed from.
        self._whole = WholeText(renderer.decode)
        self._closed = False  # a stop string or a tool call began: nothing more is shown
        self.sent = ""

    def push(self, ids: list[int]) -> str:
        for token_id in ids:
            # Special tokens are not text, at the end of the answer or inside it (the parse
            # leaves them out too, and the turn records where they were).
            if token_id not in self._special_ids:
                self._whole.push(token_id)
        return self._release()

    def take_reasoning(self) -> str:
        if self._thinking is None:
            return ""
        shown = self._thinking.reasoning_shown(self._before_stop())
        if len(shown) <= len(self.reasoning_sent) or not shown.startswith(self.reasoning_sent):
            return ""
        delta = shown[len(self.reasoning_sent) :]
        self.reasoning_sent = shown
        return delta

    def _release(self) -> str:
        text = self._whole.text
        if self._closed:
            return ""
        if self._thinking is not None:
            shown = self._thinking.shown(self._before_stop())
            if shown is None:
                return ""
            text = shown
        starts = (text.find(hold, max(len(self.sent) - len(hold), 0)) for hold in self._holds)
        found = [at for at in starts if at >= 0]
        end = min(found) if found else _unambiguous_end(text, len(self.sent), self._holds)
        self._closed = bool(found)
        if self._tools:  # the parse strips the content around tool calls
            end = len(text[:end].rstrip())
        if end <= len(self.sent):
            return ""
        delta = text[len(self.sent) : end]
        self.sent += delta
        return delta

    def _before_stop(self) -> str:
        """The text as the recorded turn cuts it, at the first stop string (the reasoning's
        too), less a suffix that more tokens could make one."""
        text = self._whole.text
        if self._stop_at is None and self._stops:
            start = max(self._searched - max(map(len, self._stops)) + 1, 0)
            found = [at for stop in self._stops if (at := text.find(stop, start)) >= 0]
            self._stop_at = min(found) if found else None
            self._searched = len(text)
        if self._stop_at is not None:
            return text[: self._stop_at]
        return text[: _unambiguous_end(text, 0, self._stops)]


def _unambiguous_end(text: str, start: int, holds: list[str]) -> int:
    """Where the text stops being shown: before the earliest suffix that could begin one of
    ``holds`` (a stop string or a tool-call tag that more tokens may complete)."""
    longest = max((len(h) for h in holds), default=0)
    for at in range(max(start, len(text) - longest + 1), len(text)):
        tail = text[at:]
        if any(h.startswith(tail) for h in holds):
            return at
    return len(text)
