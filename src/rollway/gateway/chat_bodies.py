"""OpenAI-shaped response bodies: chat completions, SSE chunks and error objects."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from rollway.gateway.chat_answer import ChatResult

_CONTENT_PIECE = 64


def completion_body(
    result: ChatResult, model: str, logprobs: dict[str, Any] | None
) -> dict[str, Any]:
    completion_tokens = result.completion_tokens
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": result.message,
                "finish_reason": result.finish_reason,
                "logprobs": logprobs,
            }
        ],
        "usage": {
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": result.prompt_tokens + completion_tokens,
        },
    }


def logprobs_body(result: ChatResult, token_text: Callable[[int], str]) -> dict[str, Any]:
    content = []
    for token_id, logprob in zip(result.completion_ids, result.logprobs, strict=True):
        text = token_text(token_id)
        content.append(
            {"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []}
        )
    return {"content": content}


def sse_events(
    result: ChatResult, model: str, logprobs: dict[str, Any] | None, include_usage: bool
) -> Iterator[bytes]:
    """The answer as chat.completion.chunk events, the way the OpenAI SDKs read a stream."""
    body = completion_body(result, model, logprobs)
    head = {k: body[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None} | extra
        return _event(head | {"choices": [choice]})

    yield chunk({"role": "assistant", "content": ""})
    content = result.message.get("content") or ""
    for start in range(0, len(content), _CONTENT_PIECE):
        yield chunk({"content": content[start : start + _CONTENT_PIECE]})
    for index, call in enumerate(result.message.get("tool_calls") or []):
        yield chunk({"tool_calls": [{"index": index, **call}]})
    yield chunk({}, result.finish_reason, logprobs=logprobs)
    if include_usage:
        yield _event(head | {"choices": [], "usage": body["usage"]})
    yield b"data: [DONE]\n\n"


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"
