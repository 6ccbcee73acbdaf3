"""OpenAI-shaped response bodies: chat completions, SSE chunks and error objects.

Asked with ``return_token_ids`` (vLLM's request field), an answer also carries what was
sampled, in fields OpenAI SDKs ignore: the completion's ids as the choice's ``token_ids``
(where vLLM puts them; null behind a chat-level engine) and, with no vLLM field for them, the
engine's logprobs (one per id, without the per-token text of OpenAI's ``logprobs``) and the
recorded turn's index under a top-level ``rollway`` object. Prompt ids are not sent back: the
trajectory holds them."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
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
from rollway.web.handlers import error_body


def completion_body(
    result: ChatResult, model: str, logprobs: dict[str, Any] | None, token_ids: bool = False
) -> dict[str, Any]:
    return choices_body([result], model, lambda _: logprobs, token_ids)


def choices_body(
    results: list[ChatResult],
    model: str,
    logprobs: Callable[[ChatResult], dict[str, Any] | None],
    token_ids: bool = False,
) -> dict[str, Any]:
    """The answer to a request of ``len(results)`` choices (``n``): usage counts the prompt
    once and every choice's completion, as OpenAI's does."""
    choices = []
    for index, result in enumerate(results):
        choice: dict[str, Any] = {
            "index": index,
            "message": result.message,
            "finish_reason": result.finish_reason,
            "logprobs": logprobs(result),
        }
        if token_ids:
            choice["token_ids"] = result.completion_ids
        choices.append(choice)
    first = results[0]
    completion = sum(result.completion_tokens for result in results)
    body: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": first.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": first.prompt_tokens + completion,
        },
    }
    if token_ids:
        body["rollway"] = {"turn_index": first.turn_index, "logprobs": first.logprobs}
        if len(results) > 1:
            body["rollway"]["choices"] = [
                {"turn_index": r.turn_index, "logprobs": r.logprobs} for r in results
            ]
    return body


#: A token's text alone and its own bytes (``ChatRenderer.token_piece``).
TokenPiece = Callable[[int], tuple[str, bytes]]


def logprobs_body(result: ChatResult, token_piece: TokenPiece, top: int) -> dict[str, Any]:
    """OpenAI's ``logprobs`` of a choice, with the ``top`` most likely tokens of each step
    that the request asked (the turn may record more: the registration asked them). Each
    token's ``bytes`` are its own: a character split across tokens joins from them."""
    content: list[dict[str, Any]] = []
    if result.completion_ids is None:  # a chat-level engine: no tokens to name
        return {"content": content}
    tops = _top_entries(result, token_piece, top) if top else None
    for at, (token_id, logprob) in enumerate(
        zip(result.completion_ids, result.logprobs or [], strict=True)
    ):
        entry = _token_entry(token_piece(token_id), logprob)
        content.append({**entry, "top_logprobs": tops[at] if tops else []})
    return {"content": content}


def _token_entry(piece: tuple[str, bytes], logprob: float) -> dict[str, Any]:
    text, raw = piece
    return {"token": text, "logprob": logprob, "bytes": list(raw)}


def _top_entries(
    result: ChatResult, token_piece: TokenPiece, top: int
) -> list[list[dict[str, Any]]] | None:
    """OpenAI's ``top_logprobs`` of each token (the first ``top``), where the turn recorded
    them."""
    if result.top_ids is None or result.top_logprobs is None:
        return None
    return [
        [_token_entry(token_piece(i), lp) for i, lp in zip(ids[:top], values[:top], strict=True)]
        for ids, values in zip(result.top_ids, result.top_logprobs, strict=True)
    ]


async def sse_events(
    pieces: AsyncIterator[TurnPiece],
    model: str,
    logprobs: Callable[[ChatResult], dict[str, Any] | None],
    include_usage: bool,
    token_ids: bool = False,
) -> AsyncGenerator[bytes, None]:
    """A streamed turn as chat.completion.chunk events, the way the OpenAI SDKs read a stream:
    content and tool calls as they come; what was sampled (logprobs, ``token_ids``) rides on
    the last chunk, the one that finishes."""
    head = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }

    def chunk(delta: dict[str, Any]) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": None, "logprobs": None}
        return _event(head | {"choices": [choice]})

    yield chunk({"role": "assistant", "content": ""})
    async for piece in pieces:
        if isinstance(piece, ContentDelta):
            yield chunk({"content": piece.text})
        elif isinstance(piece, ReasoningDelta):  # vLLM's and SGLang's delta field
            yield chunk({"reasoning_content": piece.text})
        elif isinstance(piece, ToolCallDelta):
            yield chunk({"tool_calls": [{"index": piece.index, **piece.call}]})
        else:
            result = piece
    body = completion_body(result, model, logprobs(result), token_ids)
    # The last chunk finishes: the body's choice (finish reason, logprobs, token ids) with an
    # empty delta for its message, and the body's rollway object.
    last = {k: v for k, v in body["choices"][0].items() if k != "message"} | {"delta": {}}
    extension = {"rollway": body["rollway"]} if "rollway" in body else {}
    yield _event(head | {"choices": [last]} | extension)
    if include_usage:
        yield _event(head | {"choices": [], "usage": body["usage"]})
    yield b"data: [DONE]\n\n"


def error_event(error: RollwayError) -> bytes:
    """An error after the stream began, as the OpenAI SDKs raise it."""
    return _event(error_body(error))


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"
