"""The gateway's HTTP layer: thin handlers over ``Gateway`` (parse, call the core, serialize)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from rollway import json_text, tracing
from rollway.errors import AuthError, InvalidFieldsError
from rollway.gateway.core import Gateway
from rollway.gateway.http.chat_completions_api import (
    completion_body,
    error_event,
    logprobs_body,
    sse_events,
)
from rollway.gateway.http.lease_routes import lease_endpoints
from rollway.gateway.http.messages_api import MessagesRequest, message_body
from rollway.gateway.http.messages_api import error_event as anthropic_error_event
from rollway.gateway.http.messages_api import sse_events as anthropic_sse_events
from rollway.gateway.http.responses_api import ResponsesRequest, response_body
from rollway.gateway.http.responses_api import error_event as responses_error_event
from rollway.gateway.http.responses_api import sse_events as responses_sse
from rollway.gateway.http.sse_response import EventStream, first_awaited
from rollway.gateway.metrics import PROMETHEUS_TEXT
from rollway.gateway.render.turn_stream import TurnPiece
from rollway.gateway.request_messages import ChatCompletionAsSent
from rollway.gateway.request_schema import (
    ChatCompletionRequest,
    PauseRequest,
    RegisterRequest,
    WeightUpdateRequest,
)
from rollway.generation import ChatResult
from rollway.ids import SafeId, keys_match
from rollway.trajectory import Trajectory
from rollway.trajectory_format import whole_prompts as whole_prompts_of
from rollway.web.handlers import (
    DEFAULT_MAX_BODY_BYTES,
    JSONResponse,
    bearer,
    parse_model,
    read_json,
    route_error,
)
from rollway.web.openapi import Endpoint, Param, routes_and_document


def create_app(
    gateway: Gateway,
    *,
    admin_key: str,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    close_engine: bool = True,
    extra_routes: Sequence[BaseRoute] = (),
) -> Starlette:
    """The HTTP app over ``gateway``; with ``close_engine`` the engine closes at shutdown.
    ``extra_routes`` ride on the same server (the client's callback route)."""

    def require_admin(request: Request) -> None:
        if not keys_match(bearer(request), admin_key):
            raise AuthError("this route needs the gateway's admin key")

    async def read_body(request: Request) -> dict[str, Any]:
        return await read_json(request, max_body_bytes)

    async def register(request: Request) -> Response:
        require_admin(request)
        rollout_id = request.path_params["rollout_id"]
        body = parse_model(RegisterRequest, await read_body(request))
        reuse = _flag(request.query_params.get("reuse", ""), "reuse")
        client = request.query_params.get("client")
        registration = gateway.register(rollout_id, body, reuse=reuse, client=client)
        base_url = f"{str(request.base_url).rstrip('/')}/v1/rollouts/{rollout_id}"
        return JSONResponse(
            {"rollout_id": rollout_id, "base_url": base_url, "api_key": registration.api_key}
        )

    async def chat_completions(request: Request) -> Response:
        rollout_id = request.path_params["rollout_id"]
        gateway.authorize(rollout_id, bearer(request))
        body = parse_model(ChatCompletionAsSent, await read_body(request))
        model = body.model or gateway.model_name

        def logprobs(result: ChatResult) -> dict[str, Any] | None:
            return logprobs_body(result, gateway.renderer.decode_one) if body.logprobs else None

        if body.stream:
            pieces = await first_awaited(gateway.chat_stream(rollout_id, body))
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            events = sse_events(pieces, model, logprobs, include_usage, body.return_token_ids)
            return EventStream(events, error_event)
        result = await gateway.chat(rollout_id, body)
        return JSONResponse(completion_body(result, model, logprobs(result), body.return_token_ids))

    async def messages(request: Request) -> Response:
        rollout_id = request.path_params["rollout_id"]
        gateway.authorize(rollout_id, bearer(request))
        body = parse_model(MessagesRequest, await read_body(request))
        model = body.model or gateway.model_name
        if body.stream:
            pieces = await first_awaited(gateway.chat_stream(rollout_id, as_chat(body.to_chat())))
            return EventStream(anthropic_sse_events(pieces, model), anthropic_error_event)
        result = await gateway.chat(rollout_id, as_chat(body.to_chat()))
        return JSONResponse(message_body(result, model))

    async def responses(request: Request) -> Response:
        rollout_id = request.path_params["rollout_id"]
        gateway.authorize(rollout_id, bearer(request))
        body = parse_model(ResponsesRequest, await read_body(request))
        history = gateway.response_history(rollout_id, body.previous_response_id)
        response_id, model = f"resp_{uuid.uuid4().hex}", body.model or gateway.model_name
        if body.stream:
            pieces = gateway.chat_stream(rollout_id, as_chat(body.to_chat(history)))
            remembered = await first_awaited(_remembering(pieces, rollout_id, response_id))
            events = responses_sse(remembered, model, response_id, body)
            return EventStream(events, responses_error_event)
        result = await gateway.chat(rollout_id, as_chat(body.to_chat(history)))
        gateway.remember_response(rollout_id, response_id)
        return JSONResponse(response_body(result, model, response_id, body))

    async def _remembering(
        pieces: AsyncGenerator[TurnPiece, None], rollout_id: str, response_id: str
    ) -> AsyncGenerator[TurnPiece, None]:
        """The turn's pieces; its answer names the conversation, as the JSON route does."""
        async with contextlib.aclosing(pieces):
            async for piece in pieces:
                if isinstance(piece, ChatResult):
                    gateway.remember_response(rollout_id, response_id)
                yield piece

    async def models(request: Request) -> Response:
        rollout_id = request.path_params["rollout_id"]
        gateway.authorize(rollout_id, bearer(request))
        model = {"id": gateway.model_name, "object": "model", "created": 0, "owned_by": "rollway"}
        return JSONResponse({"object": "list", "data": [model]})

    async def trajectory(request: Request) -> Response:
        require_admin(request)
        samples = _flag(request.query_params.get("samples", ""), "samples")
        prompts = _flag(request.query_params.get("whole_prompts", ""), "whole_prompts")
        found = await gateway.trajectory(request.path_params["rollout_id"])
        body = await asyncio.to_thread(trajectory_body, found, samples, prompts)  # grows with it
        return Response(body, media_type="application/json")

    async def cancel(request: Request) -> Response:
        require_admin(request)
        await gateway.cancel(request.path_params["rollout_id"])
        return JSONResponse({"cancelled": True})

    async def unregister(request: Request) -> Response:
        require_admin(request)
        await gateway.unregister(request.path_params["rollout_id"])
        return JSONResponse({"unregistered": True})

    async def update_weights(request: Request) -> Response:
        require_admin(request)
        body = parse_model(WeightUpdateRequest, await read_body(request))
        update = await gateway.weights.update(body.source, body.version, body.mode)
        return JSONResponse(update.to_dict())

    async def pause(request: Request) -> Response:
        require_admin(request)
        body = parse_model(PauseRequest, await read_body(request))
        await gateway.weights.pause(body.mode)
        return JSONResponse(gateway.weights.describe())

    async def resume(request: Request) -> Response:
        require_admin(request)
        await gateway.weights.resume()
        return JSONResponse(gateway.weights.describe())

    async def policy(request: Request) -> Response:
        require_admin(request)
        return JSONResponse(gateway.weights.describe())

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": gateway.model_name})

    async def metrics(request: Request) -> Response:
        require_admin(request)
        gateway.metrics.observe_engine(gateway.engine)
        return Response(gateway.metrics.render(), media_type=PROMETHEUS_TEXT)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        expiry = asyncio.create_task(gateway.expire_idle_forever())
        yield
        expiry.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await expiry
        if close_engine:
            await gateway.engine.close()
        # Spans still buffered: a signal may end the process next (uvicorn re-raises it).
        await asyncio.to_thread(tracing.flush)

    prefix = "/v1/rollouts/{rollout_id}"
    # Admin routes document the id rule; rollout routes answer 401 to any id without its key.
    ids = {"rollout_id": SafeId}
    chat_errors = (400, 404, 409, 413, 422, 502)
    endpoints = [
        Endpoint(
            "POST",
            f"{prefix}/register",
            register,
            "Open a rollout; returns its base URL and key",
            RegisterRequest,
            auth="adminKey",
            path_types=ids,
            errors=(400, 409, 413, 422),
            params=(
                Param("reuse", "query", bool, "Return the key of an open rollout"),
                Param("client", "query", str, "The registering client's lease holder id"),
            ),
        ),
        Endpoint(
            "POST",
            f"{prefix}/chat/completions",
            chat_completions,
            "OpenAI chat completions",
            ChatCompletionRequest,
            auth="rolloutKey",
            errors=chat_errors,
            streams=True,
        ),
        Endpoint(
            "POST",
            f"{prefix}/messages",
            messages,
            "Anthropic Messages",
            MessagesRequest,
            auth="rolloutKey",
            errors=chat_errors,
            streams=True,
        ),
        # The anthropic SDK appends /v1/messages to its base URL.
        Endpoint(
            "POST",
            f"{prefix}/v1/messages",
            messages,
            "Anthropic Messages (SDK path)",
            MessagesRequest,
            auth="rolloutKey",
            errors=chat_errors,
            streams=True,
        ),
        Endpoint(
            "POST",
            f"{prefix}/responses",
            responses,
            "OpenAI Responses API (subset)",
            ResponsesRequest,
            auth="rolloutKey",
            errors=chat_errors,
            streams=True,
        ),
        Endpoint("GET", f"{prefix}/models", models, "Model list", auth="rolloutKey"),
        Endpoint(
            "GET",
            f"{prefix}/trajectory",
            trajectory,
            "The recorded trajectory (format 2: each turn's new prompt ids)",
            auth="adminKey",
            path_types=ids,
            params=(
                Param("samples", "query", bool, "Add the training samples (samples)"),
                Param("whole_prompts", "query", bool, "Add each turn's whole prompt_ids"),
            ),
            errors=(404, 422),
            answer=Trajectory,
        ),
        Endpoint(
            "POST",
            f"{prefix}/cancel",
            cancel,
            "Abort generation, refuse further turns",
            auth="adminKey",
            path_types=ids,
            errors=(404,),
        ),
        Endpoint(
            "POST",
            f"{prefix}/unregister",
            unregister,
            "Abort and drop the rollout",
            auth="adminKey",
            path_types=ids,
            errors=(404,),
        ),
        Endpoint(
            "POST",
            "/admin/weights",
            update_weights,
            "Pause, load new weights (a folder the engine reads), resume",
            WeightUpdateRequest,
            auth="adminKey",
            errors=(400, 422, 502),
        ),
        Endpoint(
            "POST",
            "/admin/pause",
            pause,
            "Pause generation (abort, drain or keep what runs)",
            PauseRequest,
            auth="adminKey",
            errors=(400, 422, 502),
        ),
        Endpoint(
            "POST", "/admin/resume", resume, "Resume generation", auth="adminKey", errors=(400,)
        ),
        Endpoint("GET", "/admin/policy", policy, "Policy version and pause state", auth="adminKey"),
        *lease_endpoints(gateway, require_admin, read_body),
        Endpoint("GET", "/health", health, "Liveness"),
        Endpoint(
            "GET",
            "/metrics",
            metrics,
            "Prometheus metrics",
            auth="adminKey",
            media_type=PROMETHEUS_TEXT,
        ),
    ]
    routes = routes_and_document(
        endpoints,
        title="rollway gateway",
        description="OpenAI-compatible recording gateway; one base URL and key per rollout.",
        security={
            "adminKey": "the gateway's admin key",
            "rolloutKey": "the rollout's key (also accepted as x-api-key)",
        },
    )

    return Starlette(
        routes=[*routes, *extra_routes],
        lifespan=lifespan,
        exception_handlers={HTTPException: route_error},
        middleware=[Middleware(tracing.TraceContextMiddleware)],
    )


def as_chat(body: dict[str, Any]) -> ChatCompletionAsSent:
    """A Messages or Responses request as the chat request it is: its messages are new dicts
    (or the rollout's own record of earlier answers), so, like a chat body read off the wire,
    they are checked only past what the rollout's previous request sent."""
    return parse_model(ChatCompletionAsSent, body)


def trajectory_body(trajectory: Trajectory, samples: bool, whole_prompts: bool) -> bytes:
    """The trajectory as JSON; for tools that read it without rollway, optionally with its
    samples and each turn's whole prompt (which grow with the square of the conversation)."""
    if not samples and not whole_prompts:
        return trajectory.model_dump_json().encode()
    body = trajectory.model_dump(mode="json")
    if samples:
        body["samples"] = [sample.model_dump(mode="json") for sample in trajectory.samples]
    if whole_prompts and trajectory.has_token_ids:
        prompts = whole_prompts_of(trajectory.turns)
        for turn, (_, prompt) in zip(body["turns"], prompts, strict=True):
            turn["prompt_ids"] = prompt
    return json_text.dumps(body)


def _flag(value: str, param: str) -> bool:
    """A boolean query parameter; anything but true/false/1/0 (or nothing) is a 422."""
    answer = {"": False, "0": False, "false": False, "1": True, "true": True}.get(value.lower())
    if answer is None:
        raise InvalidFieldsError(f"{param} must be true or false, not {value[:40]!r}", param=param)
    return answer
