"""HTTP handlers of a rollout's turns, in the three dialects it speaks: OpenAI chat
completions, Anthropic Messages, OpenAI Responses; JSON or streamed."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from rollway.gateway.core import Gateway
from rollway.gateway.http.app_state import read_body
from rollway.gateway.http.chat_completions_api import (
    completion_body,
    error_event,
    logprobs_body,
    sse_events,
)
from rollway.gateway.http.messages_api import MessagesRequest, message_body
from rollway.gateway.http.messages_api import error_event as anthropic_error_event
from rollway.gateway.http.messages_api import sse_events as anthropic_sse_events
from rollway.gateway.http.responses_api import ResponsesRequest, response_body
from rollway.gateway.http.responses_stream import error_event as responses_error_event
from rollway.gateway.http.responses_stream import sse_events as responses_sse
from rollway.gateway.http.rollout_lookup import authorized_rollout
from rollway.gateway.http.sse_response import EventStream, first_awaited
from rollway.gateway.render.turn_stream import TurnPiece
from rollway.gateway.request_messages import ChatCompletionAsSent
from rollway.generation import ChatResult
from rollway.validation import parse_model
from rollway.web.handlers import JSONResponse


async def chat_completions(request: Request) -> Response:
    rollout_id, gateway = authorized_rollout(request)
    body = parse_model(ChatCompletionAsSent, await read_body(request))
    model = body.model or gateway.model_name

    def logprobs(result: ChatResult) -> dict[str, Any] | None:
        if not body.logprobs:
            return None
        return logprobs_body(result, gateway.renderer.token_piece, body.top_logprobs or 0)

    if body.stream:
        pieces = await first_awaited(gateway.chat_stream(rollout_id, body))
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        events = sse_events(pieces, model, logprobs, include_usage, body.return_token_ids)
        return EventStream(events, error_event)
    result = await gateway.chat(rollout_id, body)
    return JSONResponse(completion_body(result, model, logprobs(result), body.return_token_ids))


async def messages(request: Request) -> Response:
    rollout_id, gateway = authorized_rollout(request)
    body = parse_model(MessagesRequest, await read_body(request))
    model = body.model or gateway.model_name
    if body.stream:
        pieces = await first_awaited(gateway.chat_stream(rollout_id, as_chat(body.to_chat())))
        return EventStream(anthropic_sse_events(pieces, model), anthropic_error_event)
    result = await gateway.chat(rollout_id, as_chat(body.to_chat()))
    return JSONResponse(message_body(result, model))


async def responses(request: Request) -> Response:
    rollout_id, gateway = authorized_rollout(request)
    body = parse_model(ResponsesRequest, await read_body(request))
    history = gateway.response_history(rollout_id, body.previous_response_id)
    response_id, model = f"resp_{uuid.uuid4().hex}", body.model or gateway.model_name

    def logprobs(result: ChatResult) -> list[dict[str, Any]]:
        answered = logprobs_body(result, gateway.renderer.token_piece, body.top_logprobs or 0)
        content: list[dict[str, Any]] = answered["content"]
        return content

    if body.stream:
        pieces = gateway.chat_stream(rollout_id, as_chat(body.to_chat(history)))
        remembered = await first_awaited(_remembering(gateway, pieces, rollout_id, response_id))
        events = responses_sse(remembered, model, response_id, body, logprobs)
        return EventStream(events, responses_error_event)
    result = await gateway.chat(rollout_id, as_chat(body.to_chat(history)))
    gateway.remember_response(rollout_id, response_id)
    return JSONResponse(response_body(result, model, response_id, body, logprobs))


async def _remembering(
    gateway: Gateway, pieces: AsyncGenerator[TurnPiece, None], rollout_id: str, response_id: str
) -> AsyncGenerator[TurnPiece, None]:
    """The turn's pieces; its answer names the conversation, as the JSON route does."""
    async with contextlib.aclosing(pieces):
        async for piece in pieces:
            if isinstance(piece, ChatResult):
                gateway.remember_response(rollout_id, response_id)
            yield piece


def as_chat(body: dict[str, Any]) -> ChatCompletionAsSent:
    """A Messages or Responses request as the chat request it is: its messages are new dicts
    (or the rollout's own record of earlier answers), so, like a chat body read off the wire,
    they are checked only past what the rollout's previous request sent."""
    return parse_model(ChatCompletionAsSent, body)
