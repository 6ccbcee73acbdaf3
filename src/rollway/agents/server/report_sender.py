"""Deliver a finished rollout's report to the client's callback route, with bounded retries.

Connection failures and 5xx answers are retried with exponential backoff; a 4xx means the
client does not want it (restarted, or the rollout was given up) and is not retried. Either way
the report is already in the store, so an undeliverable callback loses nothing."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Literal

import aiohttp

from rollway import tracing
from rollway.errors import InfrastructureError
from rollway.results import AgentReport
from rollway.retry import Backoff, RetryPolicy

log = logging.getLogger(__name__)

Delivery = Literal["pending", "delivered", "refused", "failed", "none"]

#: A finished rollout's report to the client's callback route: connection failures and 5xx
#: answers, five tries in all (the report is in the store whatever happens).
REPORT_DELIVERY = RetryPolicy(
    attempts=5, backoff=Backoff(first_s=0.5), retry_on=(InfrastructureError,)
)


async def deliver_report(
    session: aiohttp.ClientSession,
    callback_url: str,
    callback_key: str | None,
    report: AgentReport,
    *,
    attempts: int = 5,
    wait_s: float = 0.5,
) -> Delivery:

    url = f"{callback_url.rstrip('/')}/v1/rollout/completed"
    headers = {"Content-Type": "application/json"}
    if callback_key:
        headers["Authorization"] = f"Bearer {callback_key}"
    headers = tracing.headers(headers)  # the report goes back in the rollout's trace
    policy = replace(REPORT_DELIVERY, attempts=attempts, backoff=Backoff(first_s=wait_s))
    try:
        async for attempt in policy.retrying():
            with attempt:
                status = await _post(session, url, headers, report.model_dump_json())
    except Exception as exc:  # unreachable, or a URL the client cannot even send to
        log.warning(
            "callback undeliverable: %r",
            exc,
            extra={"rollout_id": report.rollout_id, "stage": "callback"},
        )
        return "failed"
    if status >= 400:
        log.warning(
            "callback refused with %d",
            status,
            extra={"rollout_id": report.rollout_id, "stage": "callback"},
        )
        return "refused"
    return "delivered"


async def _post(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], data: str
) -> int:
    try:
        async with session.post(url, data=data, headers=headers) as response:
            await response.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise InfrastructureError(repr(exc)) from exc
    if response.status >= 500:
        raise InfrastructureError(f"HTTP {response.status}")
    return response.status
