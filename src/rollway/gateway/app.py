"""The gateway's HTTP layer: thin handlers over ``Gateway`` (parse, call the core, serialize)."""

from __future__ import annotations

import functools
import hmac
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from rollway.errors import (
    AuthError,
    InvalidFieldsError,
    MalformedBodyError,
    PayloadTooLargeError,
    RollwayError,
    http_status_for,
)
from rollway.gateway.anthropic import MessagesRequest, message_body
from rollway.gateway.anthropic import sse_events as anthropic_sse_events
from rollway.gateway.core import Gateway
from rollway.gateway.protocol import ChatCompletionRequest, RegisterRequest, parse_model
from rollway.gateway.responses import completion_body, error_body, logprobs_body, sse_events
from rollway.gateway.responses_api import ResponsesRequest, response_body
from rollway.gateway.responses_api import sse_events as responses_sse

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
Handler = Callable[[Request], Awaitable[Response]]


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def create_app(
    gateway: Gateway,
    *,
    admin_key: str,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    close_engine: bool = True,
) -> Starlette:
    """The HTTP app over ``gateway``; with ``close_engine`` the engine closes at shutdown."""

    def guarded(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def wrapper(request: Request) -> Response:
            try:
                return await handler(request)
            except RollwayError as exc:
                return JSONResponse(error_body(exc), status_code=http_status_for(exc))
            except Exception as exc:  # a bug must cost one request, never the server
                log.exception("unhandled error on %s", request.url.path)
                error = RollwayError(f"internal error: {type(exc).__name__}")
                return JSONResponse(error_body(error), status_code=500)

        return wrapper

    def require_admin(request: Request) -> None:
        if not hmac.compare_digest(_bearer(request) or "", admin_key):
            raise AuthError("this route needs the gateway's admin key")

    async def read_json(request: Request) -> dict[str, Any]:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > max_body_bytes:
            raise PayloadTooLargeError(f"body exceeds {max_body_bytes} bytes")
        body = bytearray()
        async for piece in request.stream():
            body += piece
            if len(body) > max_body_bytes:
                raise PayloadTooLargeError(f"body exceeds {max_body_bytes} bytes")
        if not body:
            return {}
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise MalformedBodyError(f"body is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise InvalidFieldsError("body must be a JSON object", param="body")
        return data

    async def register(request: Request) -> Response:
        require_admin(request)
        rollout_id = request.path_params["rollout_id"]
        body = parse_model(RegisterRequest, await read_json(request))
        registration = gateway.register(rollout_id, body)
        base_url = f"{str(request.base_url).rstrip('/')}/v1/rollouts/{rollout_id}"
        return JSONResponse(
            {"rollout_id": rollout_id, "base_url": base_url, "api_key": registration.api_key}
        )

    async def chat_completions(request: Request) -> Response:
        rollout_id = request.path_params["rollout_id"]
        gateway.authorize(rollout_id, _bearer(request))
        body = parse_model(ChatCompletionRequest, await read_json(request))
        result = await gateway.chat(rollout_id, body)
        model = body.model or gateway.model_name
        logprobs = logprobs_body(result, gateway.renderer.decode_one) if body.logprobs else None
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            events = sse_events(result, model, logprobs, include_usage)
            return StreamingResponse(events, media_type="text/event-stream")
        return JSONResponse(completion_body(result, model, logprobs))

    async def messages(request: Request) -> Response:
        rollout_id = request.path_params["rollout_id"]
        gateway.authorize(rollout_id, _bearer(request))
        body = parse_model(MessagesRequest, await read_json(request))
        result = await gateway.chat(rollout_id, body.to_chat())
        model = body.model or gateway.model_name
        if body.stream:
            events = anthropic_sse_events(result, model)
            return StreamingResponse(events, media_type="text/event-stream")
        return JSONResponse(message_body(result, model))

    async def responses(request: Request) -> Response:
        rollout_id = request.path_params["rollout_id"]
        gateway.authorize(rollout_id, _bearer(request))
        body = parse_model(ResponsesRequest, await read_json(request))
        history = gateway.response_history(rollout_id, body.previous_response_id)
        result = await gateway.chat(rollout_id, body.to_chat(history))
        response_id = f"resp_{uuid.uuid4().hex}"
        gateway.remember_response(rollout_id, response_id)
        answer = response_body(result, body.model or gateway.model_name, response_id, body)
        if body.stream:
            return StreamingResponse(responses_sse(answer), media_type="text/event-stream")
        return JSONResponse(answer)

    async def models(request: Request) -> Response:
        rollout_id = request.path_params["rollout_id"]
        gateway.authorize(rollout_id, _bearer(request))
        model = {"id": gateway.model_name, "object": "model", "created": 0, "owned_by": "rollway"}
        return JSONResponse({"object": "list", "data": [model]})

    async def trajectory(request: Request) -> Response:
        require_admin(request)
        found = gateway.trajectory(request.path_params["rollout_id"])
        return Response(found.model_dump_json(), media_type="application/json")

    async def cancel(request: Request) -> Response:
        require_admin(request)
        await gateway.cancel(request.path_params["rollout_id"])
        return JSONResponse({"cancelled": True})

    async def unregister(request: Request) -> Response:
        require_admin(request)
        await gateway.unregister(request.path_params["rollout_id"])
        return JSONResponse({"unregistered": True})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def metrics(request: Request) -> Response:
        require_admin(request)
        gateway.metrics.observe_engine(gateway.engine)
        return Response(gateway.metrics.render(), media_type="text/plain; version=0.0.4")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        if close_engine:
            await gateway.engine.close()

    prefix = "/v1/rollouts/{rollout_id}"
    routes = [
        Route(f"{prefix}/register", guarded(register), methods=["POST"]),
        Route(f"{prefix}/chat/completions", guarded(chat_completions), methods=["POST"]),
        Route(f"{prefix}/messages", guarded(messages), methods=["POST"]),
        # The anthropic SDK appends /v1/messages to its base URL.
        Route(f"{prefix}/v1/messages", guarded(messages), methods=["POST"]),
        Route(f"{prefix}/responses", guarded(responses), methods=["POST"]),
        Route(f"{prefix}/models", guarded(models), methods=["GET"]),
        Route(f"{prefix}/trajectory", guarded(trajectory), methods=["GET"]),
        Route(f"{prefix}/cancel", guarded(cancel), methods=["POST"]),
        Route(f"{prefix}/unregister", guarded(unregister), methods=["POST"]),
        Route("/health", guarded(health), methods=["GET"]),
        Route("/metrics", guarded(metrics), methods=["GET"]),
    ]

    async def route_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        body = {"error": {"message": exc.detail, "type": "invalid_request_error", "param": None}}
        return JSONResponse(body, status_code=exc.status_code)

    return Starlette(
        routes=routes, lifespan=lifespan, exception_handlers={HTTPException: route_error}
    )


def _bearer(request: Request) -> str | None:
    """The key from ``Authorization: Bearer`` (OpenAI clients) or ``x-api-key`` (Anthropic)."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.headers.get("x-api-key") or None
