"""HTTP routes of experiment leases (``gateway.experiment_leases``): admin only."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from rollway.gateway.experiment_leases import LeaseRequest, ReleaseRequest
from rollway.gateway.http.app_state import gateway_of, read_body, require_admin
from rollway.ids import SafeId, check_id
from rollway.validation import parse_model
from rollway.web.handlers import JSONResponse
from rollway.web.openapi import Endpoint


async def take(request: Request) -> Response:
    require_admin(request)
    exp_id = check_id(request.path_params["exp_id"], "exp_id")
    body = parse_model(LeaseRequest, await read_body(request))
    lease = gateway_of(request).leases.take(exp_id, body.holder, body.ttl_s)
    return JSONResponse(lease.model_dump(mode="json"))


async def release(request: Request) -> Response:
    require_admin(request)
    exp_id = check_id(request.path_params["exp_id"], "exp_id")
    body = parse_model(ReleaseRequest, await read_body(request))
    return JSONResponse({"released": gateway_of(request).leases.release(exp_id, body.holder_id)})


_PREFIX, _IDS = "/v1/experiments/{exp_id}", {"exp_id": SafeId}
LEASE_ENDPOINTS = (
    Endpoint(
        "POST", f"{_PREFIX}/lease", take,
        "Hold the experiment for one client, or renew its hold (409 names another holder)",
        LeaseRequest, auth="adminKey", path_types=_IDS, errors=(400, 409, 413, 422),
    ),
    Endpoint(
        "POST", f"{_PREFIX}/release", release, "Give the experiment's lease back",
        ReleaseRequest, auth="adminKey", path_types=_IDS, errors=(400, 413, 422),
    ),
)  # fmt: skip
