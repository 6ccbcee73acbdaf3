"""What every rollway HTTP app shares: an orjson response, a guard that turns errors into
OpenAI-shaped bodies (and never lets a bug take the server down), bounded JSON body reading,
the caller's key, and 404/405 bodies in the same shape."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from rollway import json_text
from rollway.errors import (
    AuthError,
    InvalidFieldsError,
    MalformedBodyError,
    PayloadTooLargeError,
    RollwayError,
    UnsupportedMediaTypeError,
    http_status_for,
)
from rollway.ids import keys_match

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
Handler = Callable[[Request], Awaitable[Response]]


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return json_text.dumps(content)  # a task's integer past 64 bits included


def error_body(error: RollwayError) -> dict[str, Any]:
    return {
        "error": {
            "message": error.message,
            "type": error.error_type,
            "param": error.param,
            "code": type(error).__name__,
        }
    }


def guarded(handler: Handler) -> Handler:
    """Known errors become their status and body; anything else costs one request (500)."""

    @functools.wraps(handler)
    async def wrapper(request: Request) -> Response:
        try:
            return await handler(request)
        except RollwayError as exc:
            return JSONResponse(error_body(exc), status_code=http_status_for(exc))
        except Exception as exc:
            log.exception("unhandled error on %s", request.url.path)
            error = RollwayError(f"internal error: {type(exc).__name__}")
            return JSONResponse(error_body(error), status_code=500)

    return wrapper


async def read_json(
    request: Request, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
) -> dict[str, Any]:
    """The body as a JSON object, refusing bodies over ``max_body_bytes`` before reading them
    all. The body must be declared ``application/json`` (415 otherwise): a form or a
    ``text/plain`` body is what a browser sends cross-site without asking first, and never
    what a client of these routes means. An empty body is a 422 naming it."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_body_bytes:
        raise PayloadTooLargeError(f"body exceeds {max_body_bytes} bytes")
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > max_body_bytes:
            raise PayloadTooLargeError(f"body exceeds {max_body_bytes} bytes")
    if not body.strip():
        raise InvalidFieldsError("the body is empty: send a JSON object ({} for none)", "body")
    _require_json_type(request)
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedBodyError(f"body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidFieldsError("body must be a JSON object", param="body")
    return data


def _require_json_type(request: Request) -> None:
    declared = request.headers.get("content-type", "")
    media = declared.partition(";")[0].strip().lower()
    if media != "application/json" and not (
        media.startswith("application/") and media.endswith("+json")
    ):
        shown = repr(declared[:80]) if declared else "none"
        raise UnsupportedMediaTypeError(
            f"the body must be JSON sent as Content-Type: application/json, not {shown}",
            "content-type",
        )


def bearer(request: Request) -> str | None:
    """The key from ``Authorization: Bearer`` (OpenAI clients) or ``x-api-key`` (Anthropic)."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.headers.get("x-api-key") or None


#: The header that names a call's session (a rollout id) on a gateway's shared routes.
SESSION_HEADER = "x-session-id"


def session_id(request: Request) -> str | None:
    return request.headers.get(SESSION_HEADER)


def require_key(request: Request, key: str, refusal: str) -> None:
    """An ``AuthError`` saying ``refusal`` unless the request carries ``key`` (``bearer``)."""
    if not keys_match(bearer(request), key):
        raise AuthError(refusal)


async def route_error(request: Request, exc: Exception) -> Response:
    """Unknown paths and wrong methods answer in the same error shape as everything else."""
    assert isinstance(exc, HTTPException)
    error = {"message": exc.detail, "type": "invalid_request_error", "param": None, "code": None}
    # Starlette's own headers (a 405's ``Allow``) go with it.
    return JSONResponse({"error": error}, status_code=exc.status_code, headers=exc.headers)
