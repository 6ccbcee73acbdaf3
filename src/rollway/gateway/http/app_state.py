"""What the gateway's handlers reach through ``request.app.state`` (set once by ``create_app``):
the core, the admin key, the body limit; and the query flags they share."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from rollway.errors import InvalidFieldsError
from rollway.gateway.core import Gateway
from rollway.web.handlers import read_json, require_key


def gateway_of(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


def require_admin(request: Request) -> None:
    admin_key: str = request.app.state.admin_key
    require_key(request, admin_key, "this route needs the gateway's admin key")


async def read_body(request: Request) -> dict[str, Any]:
    max_body_bytes: int = request.app.state.max_body_bytes
    return await read_json(request, max_body_bytes)


def query_flag(request: Request, param: str) -> bool:
    """A boolean query parameter; anything but true/false/1/0 (or nothing) is a 422."""
    value = request.query_params.get(param, "")
    answer = {"": False, "0": False, "false": False, "1": True, "true": True}.get(value.lower())
    if answer is None:
        raise InvalidFieldsError(f"{param} must be true or false, not {value[:40]!r}", param=param)
    return answer
