"""The client's callback route: agent servers ``POST {callback}/v1/rollout/completed`` a
finished rollout's report, and the rollout waiting on that run key wakes up."""

from __future__ import annotations

import asyncio
import secrets

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollway.errors import UnknownRolloutError
from rollway.results import AgentReport
from rollway.validation import parse_model
from rollway.web.handlers import JSONResponse, guarded, read_json, require_key


class CallbackInbox:
    def __init__(self) -> None:
        self.key = secrets.token_urlsafe(24)
        #: Where agent servers reach this client (set once the client serves HTTP).
        self.url: str | None = None
        self._waiting: dict[str, asyncio.Future[AgentReport]] = {}

    def expect(self, run_key: str) -> asyncio.Future[AgentReport]:
        waiter = asyncio.get_running_loop().create_future()
        self._waiting[run_key] = waiter
        return waiter

    def forget(self, run_key: str) -> None:
        self._waiting.pop(run_key, None)

    def deliver(self, report: AgentReport) -> bool:
        waiter = self._waiting.get(report.run_key)
        if waiter is None or waiter.done():
            return False
        waiter.set_result(report)
        return True

    def route(self) -> Route:
        async def completed(request: Request) -> Response:
            require_key(request, self.key, "wrong or missing callback key")
            report = parse_model(AgentReport, await read_json(request))
            if not self.deliver(report):
                # A 4xx tells the agent server to stop retrying: nobody waits for it (the
                # client restarted or gave up), and the report is in the store anyway.
                raise UnknownRolloutError(f"no rollout here waits for {report.run_key!r}")
            return JSONResponse({"accepted": True})

        return Route("/v1/rollout/completed", guarded(completed), methods=["POST"])
