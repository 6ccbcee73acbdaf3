"""HTTP handlers of the policy's weights (``gateway.weight_control``): admin only."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from rollway.gateway.http.app_state import gateway_of, read_body, require_admin
from rollway.gateway.request_schema import PauseRequest, WeightUpdateRequest
from rollway.validation import parse_model
from rollway.web.handlers import JSONResponse


async def update_weights(request: Request) -> Response:
    require_admin(request)
    body = parse_model(WeightUpdateRequest, await read_body(request))
    weights = gateway_of(request).weights
    update = await weights.update(body.source, body.version, body.mode, loaded=body.loaded)
    return JSONResponse(update.to_dict())


async def pause(request: Request) -> Response:
    require_admin(request)
    body = parse_model(PauseRequest, await read_body(request))
    weights = gateway_of(request).weights
    await weights.pause(body.mode)
    return JSONResponse(weights.describe().to_dict())


async def resume(request: Request) -> Response:
    require_admin(request)
    weights = gateway_of(request).weights
    await weights.resume()
    return JSONResponse(weights.describe().to_dict())


async def policy(request: Request) -> Response:
    require_admin(request)
    return JSONResponse(gateway_of(request).weights.describe().to_dict())
