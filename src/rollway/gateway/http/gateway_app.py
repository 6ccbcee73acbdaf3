"""The gateway's HTTP layer: thin handlers over ``Gateway`` (parse, call the core, serialize).

The route table is data: ``ENDPOINTS`` makes both the routes and ``/openapi.json``. Handlers
live at module level, one module per resource, and reach the core through ``app_state``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, WebSocketRoute

from rollway import tracing
from rollway.engines.base import HealthChecked
from rollway.gateway.core import Gateway
from rollway.gateway.http import chat_routes, rollout_routes, weight_routes
from rollway.gateway.http.app_state import gateway_of, require_admin
from rollway.gateway.http.lease_routes import LEASE_ENDPOINTS
from rollway.gateway.http.messages_request import CountTokensRequest, MessagesRequest
from rollway.gateway.http.responses_api import ResponsesRequest
from rollway.gateway.http.rollout_lookup import Sessions
from rollway.gateway.metrics import PROMETHEUS_TEXT
from rollway.gateway.request_schema import (
    ChatCompletionRequest,
    PauseRequest,
    RegisterRequest,
    WeightUpdateRequest,
)
from rollway.ids import SafeId
from rollway.trajectory import Trajectory
from rollway.web.handlers import DEFAULT_MAX_BODY_BYTES, JSONResponse, route_error
from rollway.web.openapi import Endpoint, Param, routes_and_document

log = logging.getLogger(__name__)


#: How long ``/health`` asks the engine: under its callers' own limit (``HEALTH_TIMEOUT_S``), so
#: an engine that hangs reads as an engine that is down, not as a gateway that is.
ENGINE_PROBE_S = 3.0


async def health(request: Request) -> Response:
    """Liveness: 200 while the gateway serves, whatever its engine does. ``engine`` says
    whether the engine serves (``up``, ``down``): a client waits out an engine outage behind a
    shared gateway as one, and a supervisor does not restart a gateway for its engine."""
    gateway = gateway_of(request)
    engine = "up" if await _engine_serves(gateway.engine) else "down"
    return JSONResponse({"status": "ok", "model": gateway.model_name, "engine": engine})


async def _engine_serves(engine: object) -> bool:
    """The engine's own health check, bounded; an engine without one runs in this process
    (embedded, simulated) and serves while the gateway does."""
    if not isinstance(engine, HealthChecked):
        return True
    try:
        async with asyncio.timeout(ENGINE_PROBE_S):
            return await engine.health()
    except Exception as exc:  # a probe that failed says the engine is down, not the gateway
        log.debug("engine health probe failed: %r", exc)
        return False


async def metrics(request: Request) -> Response:
    require_admin(request)
    gateway = gateway_of(request)
    gateway.metrics.observe_engine(gateway.engine)
    return Response(gateway.metrics.render(), media_type=PROMETHEUS_TEXT)


_PREFIX = "/v1/rollouts/{rollout_id}"
# Admin routes document the id rule; rollout routes answer 401 to any id without its key.
_IDS = {"rollout_id": SafeId}
_CHAT_ERRORS = (400, 404, 409, 413, 422, 502, 503)
_SESSION = Param(
    "X-Session-ID", "header", str, "The session (rollout id) a shared-route call belongs to"
)

#: One base URL for every rollout: each call finds its rollout by its key or session
#: (``rollout_lookup``), never by the URL alone.
SHARED_ENDPOINTS: tuple[Endpoint, ...] = (
    *(
        Endpoint(
            "POST",
            path,
            handler,
            f"{api} on the shared route (the rollout found by its key or session)",
            body,
            auth="rolloutKey",
            errors=_CHAT_ERRORS,
            streams=True,
            params=(_SESSION,),
        )
        for path, handler, api, body in (
            (
                "/v1/chat/completions",
                chat_routes.chat_completions,
                "OpenAI chat completions",
                ChatCompletionRequest,
            ),
            ("/v1/messages", chat_routes.messages, "Anthropic Messages", MessagesRequest),
            ("/v1/responses", chat_routes.responses, "OpenAI Responses", ResponsesRequest),
        )
    ),
    Endpoint(
        "GET",
        "/v1/models",
        rollout_routes.models,
        "Model list on the shared route",
        auth="rolloutKey",
        params=(_SESSION,),
    ),
    Endpoint(
        "POST",
        "/v1/messages/count_tokens",
        chat_routes.count_tokens,
        "Anthropic Messages count_tokens on the shared route",
        CountTokensRequest,
        auth="rolloutKey",
        errors=(400, 401, 404, 413, 422),
        params=(_SESSION,),
    ),
)


ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint(
        "POST",
        f"{_PREFIX}/register",
        rollout_routes.register,
        "Open a rollout; returns its base URL and key",
        RegisterRequest,
        auth="adminKey",
        path_types=_IDS,
        errors=(400, 409, 413, 422),
        params=(
            Param("reuse", "query", bool, "Return the key of an open rollout"),
            Param("client", "query", str, "The registering client's lease holder id"),
        ),
    ),
    Endpoint(
        "POST",
        f"{_PREFIX}/chat/completions",
        chat_routes.chat_completions,
        "OpenAI chat completions",
        ChatCompletionRequest,
        auth="rolloutKey",
        errors=_CHAT_ERRORS,
        streams=True,
    ),
    Endpoint(
        "POST",
        f"{_PREFIX}/messages",
        chat_routes.messages,
        "Anthropic Messages",
        MessagesRequest,
        auth="rolloutKey",
        errors=_CHAT_ERRORS,
        streams=True,
    ),
    # The anthropic SDK appends /v1/messages to its base URL.
    Endpoint(
        "POST",
        f"{_PREFIX}/v1/messages",
        chat_routes.messages,
        "Anthropic Messages (SDK path)",
        MessagesRequest,
        auth="rolloutKey",
        errors=_CHAT_ERRORS,
        streams=True,
    ),
    *(
        Endpoint(
            "POST",
            f"{_PREFIX}{path}",
            chat_routes.count_tokens,
            "Anthropic Messages count_tokens: the prompt's tokens as the renderer makes them",
            CountTokensRequest,
            auth="rolloutKey",
            errors=(400, 404, 413, 422),
        )
        for path in ("/messages/count_tokens", "/v1/messages/count_tokens")
    ),
    Endpoint(
        "POST",
        f"{_PREFIX}/responses",
        chat_routes.responses,
        "OpenAI Responses API (subset)",
        ResponsesRequest,
        auth="rolloutKey",
        errors=_CHAT_ERRORS,
        streams=True,
    ),
    Endpoint("GET", f"{_PREFIX}/models", rollout_routes.models, "Model list", auth="rolloutKey"),
    # The anthropic SDK's path; the body carries both APIs' fields.
    Endpoint("GET", f"{_PREFIX}/v1/models", rollout_routes.models, "Model list", auth="rolloutKey"),
    *SHARED_ENDPOINTS,
    Endpoint(
        "GET",
        f"{_PREFIX}/trajectory",
        rollout_routes.trajectory,
        "The recorded trajectory (format 2: each turn's new prompt ids)",
        auth="adminKey",
        path_types=_IDS,
        params=(
            Param("samples", "query", bool, "Add the training samples (samples)"),
            Param("whole_prompts", "query", bool, "Add each turn's whole prompt_ids"),
        ),
        errors=(404, 422),
        answer=Trajectory,
    ),
    Endpoint(
        "POST",
        f"{_PREFIX}/cancel",
        rollout_routes.cancel,
        "Abort generation, refuse further turns",
        auth="adminKey",
        path_types=_IDS,
        errors=(404,),
    ),
    Endpoint(
        "POST",
        f"{_PREFIX}/unregister",
        rollout_routes.unregister,
        "Abort and drop the rollout",
        auth="adminKey",
        path_types=_IDS,
        errors=(404,),
    ),
    Endpoint(
        "POST",
        "/admin/weights",
        weight_routes.update_weights,
        "Pause, load new weights (a folder the engine reads), resume",
        WeightUpdateRequest,
        auth="adminKey",
        errors=(400, 422, 502, 503),
    ),
    Endpoint(
        "POST",
        "/admin/pause",
        weight_routes.pause,
        "Pause generation (abort, drain or keep what runs)",
        PauseRequest,
        auth="adminKey",
        errors=(400, 422, 502, 503),
    ),
    Endpoint(
        "POST",
        "/admin/resume",
        weight_routes.resume,
        "Resume generation",
        auth="adminKey",
        errors=(400,),
    ),
    Endpoint(
        "GET",
        "/admin/policy",
        weight_routes.policy,
        "Policy version and pause state",
        auth="adminKey",
    ),
    *LEASE_ENDPOINTS,
    Endpoint("GET", "/health", health, "Liveness, and whether the engine serves"),
    Endpoint(
        "GET",
        "/metrics",
        metrics,
        "Prometheus metrics",
        auth="adminKey",
        media_type=PROMETHEUS_TEXT,
    ),
)


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    gateway: Gateway = app.state.gateway
    expiry = asyncio.create_task(gateway.expire_idle_forever())
    yield
    expiry.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await expiry
    if app.state.close_engine:
        await gateway.engine.close()
    # Spans still buffered: a signal may end the process next (uvicorn re-raises it).
    await asyncio.to_thread(tracing.flush)


def create_app(
    gateway: Gateway,
    *,
    admin_key: str,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    close_engine: bool = True,
    extra_routes: Sequence[BaseRoute] = (),
    sessions: Sessions = Sessions.OFF,
    session_key: str | None = None,
) -> Starlette:
    """The HTTP app over ``gateway``; with ``close_engine`` the engine closes at shutdown.
    ``extra_routes`` ride on the same server (the client's callback route). ``sessions``
    says what an ``X-Session-ID`` header may do on the shared routes (``rollout_lookup``),
    with ``session_key`` (or the admin key) as its key.
    ``app.state`` holds what the handlers reach (``app_state``): ``gateway`` is the core."""
    routes = routes_and_document(
        ENDPOINTS,
        title="rollway gateway",
        description="OpenAI-compatible recording gateway; one base URL and key per rollout.",
        security={
            "adminKey": "the gateway's admin key",
            "rolloutKey": "the rollout's key (also accepted as x-api-key)",
        },
    )
    # Codex's WebSocket attempt on /responses, answered so that it falls back at once.
    websockets = [
        WebSocketRoute(path, chat_routes.responses_websocket)
        for path in (f"{_PREFIX}/responses", "/v1/responses")
    ]
    app = Starlette(
        routes=[*routes, *websockets, *extra_routes],
        lifespan=lifespan,
        exception_handlers={HTTPException: route_error},
        middleware=[Middleware(tracing.TraceContextMiddleware)],
    )
    app.state.gateway = gateway
    app.state.admin_key = admin_key
    app.state.max_body_bytes = max_body_bytes
    app.state.close_engine = close_engine
    app.state.sessions = sessions
    app.state.session_key = session_key or admin_key
    return app
