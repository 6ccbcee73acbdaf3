"""One request passed on to the worker that holds it: the body read once (bounded), the
answer passed back as it comes (a stream's events are not held back).

A worker that cannot be reached, or dies during the call, is answered as an
``InfrastructureError`` (503) naming it: the client retries or reruns such a failure, and it
is never read as the policy's."""

from __future__ import annotations

from typing import Any

import aiohttp
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from rollway.errors import InfrastructureError, PayloadTooLargeError, RollwayError, http_status_for
from rollway.gateway.workers.worker_pool import Worker
from rollway.web.handlers import DEFAULT_MAX_BODY_BYTES, JSONResponse, error_body

#: Headers of one hop, not of the message (RFC 9110 7.6.1), and those the front's own server
#: writes again (length, date).
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
     "upgrade", "content-length", "date", "server"}
)  # fmt: skip


def error_response(error: RollwayError) -> Response:
    return JSONResponse(error_body(error), status_code=http_status_for(error))


async def read_capped(request: Request, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> bytes:
    """The body, refused past ``max_body_bytes`` before it is all read (the worker refuses
    it too, but the front should not hold it first)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_body_bytes:
        raise PayloadTooLargeError(f"body exceeds {max_body_bytes} bytes")
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > max_body_bytes:
            raise PayloadTooLargeError(f"body exceeds {max_body_bytes} bytes")
    return bytes(body)


async def forward(worker: Worker, request: Request, body: bytes) -> Response:
    """``request`` as ``worker`` answers it. The Host header goes along, so the URLs a worker
    writes into its answers (a registration's base URL) are the front's."""
    try:
        return await forward_or_raise(worker, request, body)
    except InfrastructureError as exc:
        return error_response(exc)


async def forward_or_raise(worker: Worker, request: Request, body: bytes) -> Response:
    """``forward``, a worker that did not answer raised as an ``InfrastructureError``."""
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP]
    url = worker.url + request.url.path
    if request.url.query:
        url += "?" + request.url.query
    try:
        answer = await worker.session.request(request.method, url, data=body, headers=headers)
    except (aiohttp.ClientError, OSError) as exc:
        raise _unreachable(worker, exc) from exc
    out_headers = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP_BY_HOP}
    if answer.content_type == "text/event-stream":
        return StreamingResponse(
            _passed_on(answer),
            answer.status,
            out_headers,
            background=BackgroundTask(answer.release),
        )
    try:
        content = await answer.read()
    except (aiohttp.ClientError, OSError) as exc:
        raise _unreachable(worker, exc) from exc
    finally:
        answer.release()
    return Response(content, answer.status, out_headers)


async def call_json(
    worker: Worker, method: str, path: str, admin_key: str, body: Any = None
) -> tuple[int, Any]:
    """An admin call of the front's own (fan-outs, catching a worker up): status and JSON."""
    headers = {"Authorization": f"Bearer {admin_key}"}
    try:
        async with worker.session.request(
            method, worker.url + path, json=body, headers=headers
        ) as answer:
            return answer.status, await answer.json(content_type=None)
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        raise _unreachable(worker, exc) from exc


async def _passed_on(answer: aiohttp.ClientResponse) -> Any:
    async for piece in answer.content.iter_any():
        yield piece


def _unreachable(worker: Worker, exc: BaseException) -> InfrastructureError:
    return InfrastructureError(
        f"gateway worker {worker.index} did not answer ({exc!r}): it may have died, "
        "taking the rollouts it held with it"
    )
