"""Calls from one rollway service to another (gateway admin and chat routes, agent servers):
a pooled aiohttp session, JSON both ways, the bearer key, and the callee's errors rebuilt as
the rollway errors it raised. A failure to connect or read is an ``InfrastructureError``; a 429
is an ``OverloadedError`` carrying the callee's ``Retry-After``."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from rollway import tracing
from rollway.errors import InfrastructureError, OverloadedError, error_from_body

#: A liveness call that takes longer than this finds its server down (or hung).
HEALTH_TIMEOUT_S = 5.0


def new_session(total_s: float | None = None) -> aiohttp.ClientSession:
    """A pooled session (open it on the loop that will use it); ``total_s`` bounds each call
    (None: generation may take as long as it takes)."""
    connector = aiohttp.TCPConnector(limit=4096, keepalive_timeout=60)
    return aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=total_s, sock_connect=10)
    )


async def request_json(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    key: str,
    body: dict[str, Any] | None = None,
) -> Any:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    headers = tracing.headers(headers)  # traceparent, when tracing is on
    data = orjson.dumps(body) if body is not None else None
    try:
        async with session.request(method, url, data=data, headers=headers) as response:
            status, raw = response.status, await response.read()
            retry_after = response.headers.get("Retry-After", "")
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise InfrastructureError(f"{url} unreachable: {exc!r}") from exc
    try:
        answer = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        answer = raw.decode(errors="replace")
    if status == 429:
        seconds = float(retry_after) if retry_after.replace(".", "", 1).isdigit() else 1.0
        raise OverloadedError(f"{url} is at capacity", retry_after_s=seconds)
    if status >= 400:
        raise error_from_body(status, answer)
    return answer
