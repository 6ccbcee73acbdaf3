"""The agent server's HTTP layer: thin handlers over ``AgentService``.

POST /v1/rollout/init            start a rollout (202 with the agent's tools)
GET  /v1/rollout/{id}            its status, and its report once finished
POST /v1/rollout/{id}/cancel     stop it (it still reports, as ``cancelled``)
GET  /v1/health                  agent, tools, load (needs the key)
GET  /health                     liveness (no key)
GET  /openapi.json               the OpenAPI document of these routes (no key)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response

from rollway import tracing
from rollway.agents.base import AgentLoop
from rollway.agents.server.agent_schema import InitRequest
from rollway.agents.server.service import AgentServerConfig, AgentService, Run
from rollway.agents.validate import ready_agent
from rollway.errors import InvalidFieldsError, OverloadedError
from rollway.ids import IdempotencyKey
from rollway.validation import parse_model
from rollway.web.handlers import (
    JSONResponse,
    error_body,
    read_json,
    require_key,
    route_error,
)
from rollway.web.openapi import Endpoint, Param, routes_and_document


def _service(request: Request) -> AgentService:
    service: AgentService = request.app.state.service
    return service


def _require_key(request: Request) -> None:
    api_key: str = request.app.state.api_key
    require_key(request, api_key, "wrong or missing agent server key")


async def init(request: Request) -> Response:
    _require_key(request)
    body = await read_json(request)
    header_key = request.headers.get("idempotency-key")
    if header_key:
        if body.get("idempotency_key") not in (None, header_key):
            raise InvalidFieldsError(
                "idempotency_key differs from the Idempotency-Key header",
                param="idempotency_key",
            )
        body["idempotency_key"] = header_key
    try:
        run, created = await _service(request).start(parse_model(InitRequest, body))
    except OverloadedError as exc:
        headers = {"Retry-After": f"{max(1, round(exc.retry_after_s))}"}
        return JSONResponse(error_body(exc), status_code=429, headers=headers)
    return JSONResponse({**_status(run), "tools": run.tools, "created": created}, 202)


async def status(request: Request) -> Response:
    _require_key(request)
    return JSONResponse(_status(_service(request).get(request.path_params["rollout_id"])))


async def cancel(request: Request) -> Response:
    _require_key(request)
    run = _service(request).cancel(request.path_params["rollout_id"])
    return JSONResponse(_status(run), 200 if run.report.finished else 202)


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def health_detail(request: Request) -> Response:
    _require_key(request)
    service = _service(request)
    return JSONResponse(
        {
            "status": "ok",
            "agent": service.agent.name,
            "tools": service.agent.get_default_tools(),
            "running": service.running,
            "max_concurrent": service.config.max_concurrent,
            "runs_started": service.runs_started,
        }
    )


ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint(
        "POST",
        "/v1/rollout/init",
        init,
        "Start a rollout (202 with the agent's tools)",
        InitRequest,
        auth="agentKey",
        status=202,
        errors=(400, 409, 413, 422, 429),
        params=(Param("Idempotency-Key", "header", IdempotencyKey),),
    ),
    Endpoint(
        "GET",
        "/v1/rollout/{rollout_id}",
        status,
        "Its status, and its report once finished",
        auth="agentKey",
        errors=(404,),
    ),
    Endpoint(
        "POST",
        "/v1/rollout/{rollout_id}/cancel",
        cancel,
        "Stop it (it still reports)",
        auth="agentKey",
        errors=(404,),
    ),
    Endpoint("GET", "/v1/health", health_detail, "Agent, tools, load", auth="agentKey"),
    Endpoint("GET", "/health", health, "Liveness"),
)


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    service: AgentService = app.state.service
    yield
    await service.close()
    # Spans still buffered: a signal may end the process next (uvicorn re-raises it).
    await asyncio.to_thread(tracing.flush)


def create_app(
    agent: AgentLoop | type[AgentLoop] | str,
    *,
    api_key: str,
    config: AgentServerConfig | None = None,
) -> Starlette:
    """Serve ``agent`` (validated now: an invalid agent raises ``AgentError`` and nothing is
    served). ``app.state.service`` is the core, for tests and embedding; the handlers reach it
    and ``app.state.api_key`` through the request."""
    service = AgentService(ready_agent(agent), config)
    routes = routes_and_document(
        ENDPOINTS,
        title="rollway agent server",
        description=f"Runs rollouts of the agent {service.agent.name!r}.",
        security={"agentKey": "the agent server's key"},
    )
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: route_error},
        # An init's traceparent: the rollout's run (a task started by the init) joins it.
        middleware=[Middleware(tracing.TraceContextMiddleware)],
    )
    app.state.service = service
    app.state.api_key = api_key
    return app


def _status(run: Run) -> dict[str, Any]:
    return {
        "rollout_id": run.init.rollout_id,
        "run_key": run.key,
        "status": run.report.status,
        "callback": run.callback,
        "report": run.report.model_dump(mode="json") if run.report.finished else None,
    }
