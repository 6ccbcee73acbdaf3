"""The Anthropic Messages API over the same recording core: the request (``messages_request``)
is answered by ``Gateway.chat`` token-exactly and translated back (JSON, or SSE events the
official ``anthropic`` SDK reads)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import orjson

from rollway.errors import RollwayError
from rollway.gateway.render.turn_stream import (
    ContentDelta,
    ReasoningDelta,
    ToolCallDelta,
    TurnPiece,
)
from rollway.generation import ChatResult

_STOP_REASON = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


def message_body(result: ChatResult, model: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if reasoning := result.message.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if result.message.get("content"):
        content.append({"type": "text", "text": result.message["content"]})
    content += [_tool_use(call) for call in result.message.get("tool_calls") or []]
    return _message(model, content, result) | {"usage": _usage(result)}


def _message(
    model: str, content: list[dict[str, Any]], result: ChatResult | None
) -> dict[str, Any]:
    return {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": None if result is None else _stop_reason(result),
        "stop_sequence": None if result is None else result.stop_sequence,
    }


def _stop_reason(result: ChatResult) -> str:
    if result.stop_sequence is not None and result.finish_reason == "stop":
        return "stop_sequence"
    return _STOP_REASON.get(result.finish_reason, "end_turn")


def _usage(result: ChatResult) -> dict[str, int]:
    return {"input_tokens": result.prompt_tokens, "output_tokens": result.completion_tokens}


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    return {
        "type": "tool_use",
        "id": call["id"],
        "name": function["name"],
        "input": json.loads(function["arguments"] or "{}"),
    }


async def sse_events(pieces: AsyncIterator[TurnPiece], model: str) -> AsyncGenerator[bytes, None]:
    """A streamed turn as Anthropic stream events, in the order the SDK expects: a thinking
    block and a text block whose deltas come as the tokens do, then a block per tool call.
    The prompt's token count is known at the end: ``message_delta`` carries it (the SDK
    takes it from there)."""
    start = _message(model, [], None) | {"usage": {"input_tokens": 0, "output_tokens": 0}}
    yield _event("message_start", {"type": "message_start", "message": start})
    blocks, text_open, thinking_open = 0, False, False
    async for piece in pieces:
        if isinstance(piece, ChatResult):
            result = piece
            continue
        if isinstance(piece, ReasoningDelta):  # the reasoning comes before anything else
            if not thinking_open:
                yield _block_start(blocks, {"type": "thinking", "thinking": "", "signature": ""})
                blocks, thinking_open = blocks + 1, True
            yield _block_delta(blocks - 1, {"type": "thinking_delta", "thinking": piece.text})
            continue
        if thinking_open:
            yield _block_stop(blocks - 1)
            thinking_open = False
        if text_open and isinstance(piece, ToolCallDelta):
            yield _block_stop(blocks - 1)
            text_open = False
        if isinstance(piece, ContentDelta):
            if not text_open:
                yield _block_start(blocks, {"type": "text", "text": ""})
                blocks, text_open = blocks + 1, True
            yield _block_delta(blocks - 1, {"type": "text_delta", "text": piece.text})
        else:
            block = _tool_use(piece.call)
            yield _block_start(
                blocks, {k: block[k] for k in ("type", "id", "name")} | {"input": {}}
            )
            arguments = json.dumps(block["input"])
            yield _block_delta(blocks, {"type": "input_json_delta", "partial_json": arguments})
            yield _block_stop(blocks)
            blocks += 1
    if text_open or thinking_open:
        yield _block_stop(blocks - 1)
    delta = {"stop_reason": _stop_reason(result), "stop_sequence": result.stop_sequence}
    usage = _usage(result)
    yield _event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
    yield _event("message_stop", {"type": "message_stop"})


def error_event(error: RollwayError) -> bytes:
    """An error after the stream began, as the anthropic SDK raises it."""
    body = {"type": error.error_type, "message": error.message}
    return _event("error", {"type": "error", "error": body})


def _block_start(index: int, block: dict[str, Any]) -> bytes:
    payload = {"type": "content_block_start", "index": index, "content_block": block}
    return _event("content_block_start", payload)


def _block_delta(index: int, delta: dict[str, Any]) -> bytes:
    payload = {"type": "content_block_delta", "index": index, "delta": delta}
    return _event("content_block_delta", payload)


def _block_stop(index: int) -> bytes:
    return _event("content_block_stop", {"type": "content_block_stop", "index": index})


def _event(name: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"
