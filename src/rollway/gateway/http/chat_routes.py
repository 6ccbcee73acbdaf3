"""HTTP handlers of a rollout's turns, in the three dialects it speaks: OpenAI chat
completions, Anthropic Messages, OpenAI Responses; JSON or streamed. Every 4xx they answer
is logged and counted on the rollout's record (``refusals_noted``)."""

from __future__ import annotations

import contextlib
import functools
import logging
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.websockets import WebSocket

from rollway.errors import RollwayError, http_status_for
from rollway.gateway.core import Gateway
from rollway.gateway.http.app_state import gateway_of, read_body
from rollway.gateway.http.chat_completions_api import (
    choices_body,
    error_event,
    logprobs_body,
    sse_events,
)
from rollway.gateway.http.messages_api import error_event as anthropic_error_event
from rollway.gateway.http.messages_api import message_body
from rollway.gateway.http.messages_api import sse_events as anthropic_sse_events
from rollway.gateway.http.messages_request import CountTokensRequest, MessagesRequest
from rollway.gateway.http.responses_api import ResponsesRequest, response_body
from rollway.gateway.http.responses_stream import error_event as responses_error_event
from rollway.gateway.http.responses_stream import sse_events as responses_sse
from rollway.gateway.http.rollout_lookup import authorized_rollout
from rollway.gateway.http.sse_response import EventStream, first_awaited
from rollway.gateway.render.turn_stream import TurnPiece
from rollway.gateway.request_messages import ChatCompletionAsSent
from rollway.generation import ChatResult
from rollway.validation import parse_model
from rollway.web.handlers import Handler, JSONResponse, error_body

log = logging.getLogger(__name__)


def refusals_noted(handler: Handler) -> Handler:
    """``handler``, each 4xx it answers logged with the rollout's id and counted on the
    rollout's record (``Trajectory.refusals``) once the caller proved it holds the key."""

    @functools.wraps(handler)
    async def noted(request: Request) -> Response:
        try:
            return await handler(request)
        except RollwayError as exc:
            status = http_status_for(exc)
            # A shared route's call names its rollout only once its key or session is known.
            rollout_id = request.scope.get("rollway.rollout_id")
            rollout_id = rollout_id or request.path_params.get("rollout_id", "(shared route)")
            if 400 <= status < 500 and request.scope.get("rollway.authorized"):
                gateway_of(request).note_refusal(rollout_id, status, error_body(exc))
            elif 400 <= status < 500:  # not shown to be the rollout's agent: not counted
                log.warning(
                    "refused a request on rollout %s (%d): %s",
                    rollout_id,
                    status,
                    exc.message,
                    extra={"rollout_id": rollout_id, "stage": "refusal"},
                )
            raise

    return noted


def _authorized(request: Request) -> tuple[str, Gateway]:
    """The call's rollout, its key checked (``rollout_lookup``): from here on a refusal is
    counted on that rollout's record."""
    rollout_id, gateway = authorized_rollout(request)
    request.scope["rollway.rollout_id"] = rollout_id
    request.scope["rollway.authorized"] = True
    return rollout_id, gateway


@refusals_noted
async def chat_completions(request: Request) -> Response:
    rollout_id, gateway = _authorized(request)
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
    results = await gateway.chat_choices(rollout_id, body)
    return JSONResponse(choices_body(results, model, logprobs, body.return_token_ids))


@refusals_noted
async def messages(request: Request) -> Response:
    rollout_id, gateway = _authorized(request)
    body = parse_model(MessagesRequest, await read_body(request))
    model = body.model or gateway.model_name
    chat = as_chat(body.to_chat(), body.recorded_fields())
    if body.stream:
        pieces = await first_awaited(gateway.chat_stream(rollout_id, chat))
        return EventStream(anthropic_sse_events(pieces, model), anthropic_error_event)
    result = await gateway.chat(rollout_id, chat)
    return JSONResponse(message_body(result, model))


@refusals_noted
async def count_tokens(request: Request) -> Response:
    """Anthropic's ``count_tokens``: the prompt's tokens as this rollout's renderer makes them."""
    rollout_id, gateway = _authorized(request)
    body = parse_model(CountTokensRequest, await read_body(request))
    tokens = await gateway.count_tokens(rollout_id, as_chat(body.to_chat()))
    return JSONResponse({"input_tokens": tokens})


async def responses_websocket(websocket: WebSocket) -> None:
    """Codex opens a WebSocket on ``/responses`` first: a 426 to the handshake makes it fall
    back to HTTPS at once, for the session (codex-rs ``core/src/client.rs``: a handshake
    answered ``UPGRADE_REQUIRED`` is ``FallbackToHttp``; any other status is retried)."""
    body = error_body(
        RollwayError("the Responses API is served over HTTPS here: POST /responses", "upgrade")
    )
    headers = {"Upgrade": "HTTP/1.1"}
    await websocket.send_denial_response(JSONResponse(body, status_code=426, headers=headers))


@refusals_noted
async def responses(request: Request) -> Response:
    rollout_id, gateway = _authorized(request)
    body = parse_model(ResponsesRequest, await read_body(request))
    history = gateway.response_history(rollout_id, body.previous_response_id)
    recorded = body.recorded_fields()
    response_id, model = f"resp_{uuid.uuid4().hex}", body.model or gateway.model_name

    def logprobs(result: ChatResult) -> list[dict[str, Any]]:
        answered = logprobs_body(result, gateway.renderer.token_piece, body.top_logprobs or 0)
        content: list[dict[str, Any]] = answered["content"]
        return content

    if body.stream:
        pieces = gateway.chat_stream(rollout_id, as_chat(body.to_chat(history), recorded))
        remembered = await first_awaited(_remembering(gateway, pieces, rollout_id, response_id))
        events = responses_sse(remembered, model, response_id, body, logprobs)
        return EventStream(events, responses_error_event)
    result = await gateway.chat(rollout_id, as_chat(body.to_chat(history), recorded))
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


def as_chat(body: dict[str, Any], recorded: dict[str, Any] | None = None) -> ChatCompletionAsSent:
    """A Messages or Responses request as the chat request it is: its messages are new dicts
    (or the rollout's own record of earlier answers), so, like a chat body read off the wire,
    they are checked only past what the rollout's previous request sent. ``recorded``: the
    request's fields recorded with its turn."""
    chat = parse_model(ChatCompletionAsSent, body)
    chat.carry(recorded or {})
    return chat
