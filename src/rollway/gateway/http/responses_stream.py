"""A streamed Responses API turn: the SSE events the openai SDK reads, in OpenAI's order.

The reasoning item streams first (``response.reasoning_text.delta``, as vLLM sends an open
model's thinking), closed when the answer goes on; then the message's text deltas as the
tokens come; then each function call item whole (the calls are known once the answer is
parsed). Each item keeps one id from its ``output_item.added`` to ``response.completed``."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Any

import orjson

from rollway.errors import RollwayError
from rollway.gateway.http.responses_api import (
    ResponsesRequest,
    TextLogprobs,
    item_id,
    pending,
    reasoning_item,
    response_body,
)
from rollway.gateway.render.turn_stream import ContentDelta, ReasoningDelta, TurnPiece
from rollway.generation import ChatResult
from rollway.web.handlers import error_body

#: The content part each streamed item's text is in, by item type.
_PART = {"reasoning": "reasoning_text", "message": "output_text"}


class _Events:
    """The stream's event writer: numbers the events, and knows the items opened so far."""

    def __init__(self) -> None:
        self._sequence = 0
        self.ids = {kind: item_id(kind) for kind in _PART}
        self.opened: dict[str, int] = {}  # item type -> its output index, in streamed order
        self.closed: set[str] = set()
        self.texts: dict[str, str] = {}

    def event(self, kind: str, **data: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._sequence, **data}
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    def where(self, kind: str) -> dict[str, Any]:
        return {"item_id": self.ids[kind], "output_index": self.opened[kind], "content_index": 0}

    def open(self, kind: str) -> Iterator[bytes]:
        """``kind``'s item and its (empty) content part, at the next output index."""
        self.opened[kind], self.texts[kind] = len(self.opened), ""
        if kind == "reasoning":
            item = reasoning_item(self.ids[kind], "", "in_progress") | {"content": []}
        else:
            item = {"type": "message", "id": self.ids[kind], "status": "in_progress"}
            item |= {"role": "assistant", "content": []}
        yield self.event("response.output_item.added", output_index=self.opened[kind], item=item)
        part: dict[str, Any] = {"type": _PART[kind], "text": ""}
        part |= {"annotations": []} if kind == "message" else {}
        yield self.event("response.content_part.added", **self.where(kind), part=part)

    def delta(self, kind: str, text: str) -> Iterator[bytes]:
        if kind not in self.opened:
            yield from self.open(kind)
        self.texts[kind] += text
        if kind == "reasoning":
            yield self.event("response.reasoning_text.delta", **self.where(kind), delta=text)
        else:
            yield self.event(
                "response.output_text.delta", **self.where(kind), delta=text, logprobs=[]
            )

    def close(self, kind: str, item: dict[str, Any]) -> Iterator[bytes]:
        """The done events of a streamed item, ``item`` as it ends."""
        self.closed.add(kind)
        where, part = self.where(kind), item["content"][0]
        if kind == "reasoning":
            yield self.event("response.reasoning_text.done", **where, text=part["text"])
        else:
            text, answered = part["text"], part["logprobs"]
            yield self.event("response.output_text.done", **where, text=text, logprobs=answered)
        yield self.event("response.content_part.done", **where, part=part)
        yield self.event("response.output_item.done", output_index=where["output_index"], item=item)

    def close_reasoning(self) -> Iterator[bytes]:
        """The reasoning is whole once the answer goes on (content follows its end)."""
        if "reasoning" in self.opened and "reasoning" not in self.closed:
            yield from self.close(
                "reasoning", reasoning_item(self.ids["reasoning"], self.texts["reasoning"])
            )


async def sse_events(
    pieces: AsyncIterator[TurnPiece],
    model: str,
    response_id: str,
    request: ResponsesRequest,
    logprobs: TextLogprobs,
) -> AsyncGenerator[bytes, None]:
    """A streamed turn as Responses API events. Asked logprobs come whole with the text's
    ``done`` event (a delta's text is not cut at token boundaries)."""
    events = _Events()
    start = pending(model, response_id, request)
    yield events.event("response.created", response=start)
    yield events.event("response.in_progress", response=start)
    async for piece in pieces:
        if isinstance(piece, ChatResult):
            result = piece
        elif isinstance(piece, ReasoningDelta) and "message" not in events.opened:
            for event in events.delta("reasoning", piece.text):
                yield event
        elif isinstance(piece, ContentDelta):
            for event in [*events.close_reasoning(), *events.delta("message", piece.text)]:
                yield event
    for event in events.close_reasoning():
        yield event
    body = response_body(result, model, response_id, request, logprobs, events.ids)
    body["output"] = _in_streamed_order(body["output"], events.opened)
    for index, item in enumerate(body["output"]):
        for event in _rest_of(events, index, item):
            yield event
    yield events.event("response.completed", response=body)


def _in_streamed_order(
    output: list[dict[str, Any]], opened: dict[str, int]
) -> list[dict[str, Any]]:
    """The items streamed first, in the order they were, then the others as answered."""
    return sorted(output, key=lambda item: opened.get(item["type"], len(opened)))


def _rest_of(events: _Events, index: int, item: dict[str, Any]) -> Iterator[bytes]:
    """What the stream has not yet said of the output's item ``index``: a function call whole,
    the end of the message."""
    kind = item["type"]
    if kind == "function_call":
        added = item | {"status": "in_progress", "arguments": ""}
        yield events.event("response.output_item.added", output_index=index, item=added)
        at = {"item_id": item["id"], "output_index": index}
        arguments = item["arguments"]
        yield events.event("response.function_call_arguments.delta", **at, delta=arguments)
        yield events.event(
            "response.function_call_arguments.done", **at, arguments=arguments, name=item["name"]
        )
        yield events.event("response.output_item.done", output_index=index, item=item)
        return
    if kind in events.closed:
        return
    if kind not in events.opened:  # answered whole (a stream that sent none of it)
        yield from events.delta(kind, item["content"][0]["text"])
    yield from events.close(kind, item)


def error_event(error: RollwayError) -> bytes:
    """An error after the stream began, as the openai SDK raises it."""
    payload = {
        "type": "error",
        "code": type(error).__name__,
        "message": error.message,
        "param": error.param,
    } | error_body(error)
    return b"event: error\ndata: " + orjson.dumps(payload) + b"\n\n"
