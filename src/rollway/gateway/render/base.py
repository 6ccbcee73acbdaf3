"""The renderer seam: what the gateway asks of a model family's renderer.

A renderer turns messages (and tools) into the prompt's ids, extends a previous turn's sampled
ids with new messages (or says it cannot), parses a completion into reasoning, content and
tool calls (a malformed call flagged, never guessed) and names the ids that end a turn. The
families are named in ``registry``; ``chat_template.ChatRenderer`` is the template-driven
implementation they share (``hermes``), ``families`` holds the others.
"""

from __future__ import annotations

from typing import Any, Protocol

from rollway.gateway.render.tool_calls import ParsedToolCalls
from rollway.generation import Message


class Renderer(Protocol):
    #: The registry's name for it (``rollway gateway --renderer NAME``).
    name: str
    #: Ids that end a turn, and that a turn's text leaves out where sampled inside it.
    stop_ids: frozenset[int]
    #: Text where a tool call begins: a stream shows nothing from there until it is parsed.
    tool_call_open: str

    def prompt_ids(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None,
        max_tokens: int | None = None,
    ) -> list[int]:
        """The whole conversation, ready for the model to answer."""
        ...

    def continuation_ids(
        self,
        completion_ids: list[int],
        new_messages: list[Message],
        tools: list[dict[str, Any]] | None,
        max_tokens: int | None = None,
        keep_sampled: bool = True,
    ) -> list[int] | None:
        """Ids to append after a sampled completion for ``new_messages`` and the generation
        prompt; None where the template renders the history otherwise and ``keep_sampled``
        is off (the caller then starts a new segment)."""
        ...

    def decode(self, ids: list[int]) -> str:
        """A completion's ids as text, special tokens included (the caller drops them)."""
        ...

    def parse(
        self,
        text: str,
        use_tools: bool,
        tools: list[dict[str, Any]] | None = None,
        end_id: int | None = None,
    ) -> ParsedToolCalls:
        """A completion's text as reasoning, content and tool calls; a malformed call keeps
        the text whole and says why in ``error``. ``tools``: the request's, whose schemas
        type the arguments where a family writes them as text (Qwen3-Coder's XML calls).
        ``end_id``: the stop token the model ended the answer with (cut from ``text``; None
        where none did), for families whose stop tokens differ in meaning (GPT-OSS's)."""
        ...
