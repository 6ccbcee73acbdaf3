"""An agent served elsewhere (``rollway serve-agent``), driven like an in-process one.

``RemoteAgent.run`` starts the rollout on the agent server (which talks to this client's
gateway over HTTP) and waits for its report: by callback, or else by polling the store with
exponential backoff (HEAD requests), with an occasional status call so that an agent server
that lost the rollout (restarted) ends the wait as an infrastructure error. A status call that
finds the server unreachable asks the client's outage tracking (``bind``'s ``is_down``) whether
it is down: then the outage is marked once for every rollout and this attempt ends, to wait for
it; else ``PollPolicy.max_status_failures`` such calls in a row end it. The init carries an
idempotency key derived from the rollout id and its gateway key, so a repeated init never starts
a second run."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import httpx

from rollway.agents.base import AgentLoop
from rollway.agents.context import InitFields, RolloutContext
from rollway.agents.server.callback_inbox import CallbackInbox
from rollway.agents.validate import ready_agent
from rollway.errors import (
    AgentError,
    ConfigError,
    EngineError,
    InfrastructureError,
    OverloadedError,
    RollwayError,
)
from rollway.results import AgentReport, AgentResult
from rollway.retry import Backoff, RetryPolicy
from rollway.store.base import Store
from rollway.web.http_client import HEALTH_TIMEOUT_S, new_session, request_json

#: A rollout's init on an agent server: unreachable or failing (5xx), three tries in all; at
#: capacity (429), again after its ``Retry-After`` for as long as the rollout may wait.
#: ``RemoteAgent`` paces the waits with its ``PollPolicy`` (twice the first poll interval).
AGENT_INIT = RetryPolicy(
    attempts=3,
    backoff=Backoff(first_s=1.0),
    retry_on=(InfrastructureError,),
    wait_out_overload=True,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PollPolicy:
    """How a rollout waits for its report when no callback comes."""

    initial_s: float = 0.5
    max_s: float = 10.0
    factor: float = 2.0
    #: How often to ask the agent server whether it still knows the rollout.
    status_every_s: float = 15.0
    #: Status calls in a row that find the agent server unreachable, while its health answers,
    #: before the rollout is an infrastructure error (retried, rerun by resume). One whose
    #: health does not answer is an outage at once (``RemoteAgent.bind``).
    max_status_failures: int = 4


def run_key(rollout_id: str, api_key: str) -> str:
    """One rollout at one gateway registration: a client that restarts against the same
    (durable) gateway derives the same key and re-attaches instead of starting again."""
    return f"{rollout_id}-{hashlib.sha256(api_key.encode()).hexdigest()[:12]}"


class RemoteAgent(AgentLoop):
    name = "remote"
    needs_http = True
    #: A rollout left open on a shared gateway by a client that died is picked up, not rerun.
    reattaches = True

    def __init__(self, url: str, *, api_key: str, poll: PollPolicy | None = None) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.poll = poll or PollPolicy()
        info = _health(self.url, api_key)
        self.name = str(info["agent"])  # type: ignore[misc]  # per instance: the served agent
        self.default_tools: list[dict[str, Any]] = list(info.get("tools") or [])
        self._store: Store | None = None
        self._inbox: CallbackInbox | None = None
        self._settings: InitFields | None = None
        self._session: aiohttp.ClientSession | None = None
        self._is_down: Callable[[], Awaitable[bool]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Shipped to Ray workers unbound: each binds its own store, callback route, session.
        unbound = {
            "_store": None, "_inbox": None, "_settings": None, "_session": None, "_is_down": None
        }  # fmt: skip
        return {**self.__dict__, **unbound}

    def bind(
        self,
        store: Store,
        inbox: CallbackInbox | None,
        settings: InitFields,
        is_down: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        """Called by the client: where reports land, the callback route, what inits carry,
        and ``is_down``, its outage tracking's probe of this agent server (``Availability``)."""
        self._store, self._inbox, self._settings = store, inbox, settings
        self._is_down = is_down

    def get_tools(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        return self.default_tools

    async def run(self, ctx: RolloutContext) -> AgentResult:
        if ctx.base_url is None or ctx.api_key is None or (ctx.settings or self._settings) is None:
            raise AgentError("a remote agent needs a client that serves its gateway over HTTP")
        key = run_key(ctx.rollout_id, ctx.api_key)
        waiter = self._inbox.expect(key) if self._inbox is not None else None
        try:
            await self._init(ctx, key)
            report = await self._wait(ctx.rollout_id, key, waiter)
            ctx.log_event("wait", status=report.status)
        finally:
            if self._inbox is not None:
                self._inbox.forget(key)
        ctx.metrics = report.metrics
        return _result(report)

    async def stop(self, ctx: RolloutContext) -> None:
        """Tell the agent server to stop the rollout now (best effort)."""
        try:
            await self._call("POST", f"/v1/rollout/{ctx.rollout_id}/cancel")
        except Exception as exc:
            ctx.cleanup_failed("stop", exc)

    async def health(self) -> bool:
        """Whether the agent server answers its liveness route (rollouts wait while it does
        not)."""
        timeout = aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)
        async with self._client().get(f"{self.url}/health", timeout=timeout) as response:
            return response.status == 200

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    # -- internals ---------------------------------------------------------------------------

    async def _init(self, ctx: RolloutContext, key: str) -> None:
        # The rollout's own settings (a per-call override of timeout or sampling included).
        settings = ctx.settings or self._settings
        assert settings is not None and ctx.base_url is not None
        limits = settings.limits
        timeout_s = limits.timeout
        body = {
            "rollout_id": ctx.rollout_id,
            "exp_id": settings.exp_id,
            "base_url": ctx.base_url,
            "api_key": ctx.api_key,
            "model": ctx.gateway.model_name,
            "task": ctx.task,
            "sampling": settings.fixed_sampling(),
            # A little longer than the client's own timeout: the client decides the outcome.
            "limits": {
                "timeout_s": timeout_s + 5.0 if timeout_s else None,
                "max_turns": limits.max_turns,
                "max_seq_len": limits.max_seq_len,
            },
            "callback_url": self._inbox.url if self._inbox else None,
            "callback_key": self._inbox.key if self._inbox else None,
            "idempotency_key": key,
            "debug": settings.debug,
        }
        # Paced like the poll; an overload waits for as long as the client's timeout and
        # cancel allow (they cancel this task).
        retries = replace(AGENT_INIT, backoff=Backoff(2 * self.poll.initial_s)).retrying()
        await retries(self._call, "POST", "/v1/rollout/init", body)
        ctx.log_event("start_agent", agent_server=self.url, run_key=key)

    async def _wait(
        self, rollout_id: str, key: str, waiter: asyncio.Future[AgentReport] | None
    ) -> AgentReport:
        assert self._store is not None
        intervals = Backoff(self.poll.initial_s, self.poll.factor, self.poll.max_s).delays_s()
        last_status = time.monotonic()
        unreachable = 0
        while True:
            interval = next(intervals)
            if waiter is not None:
                await asyncio.wait({waiter}, timeout=interval)
                if waiter.done():
                    return waiter.result()
            else:
                await asyncio.sleep(interval)
            if await asyncio.to_thread(self._store.report_exists, key):
                report = await asyncio.to_thread(self._store.get_report, key)
                if report is not None:
                    return report
            if time.monotonic() - last_status >= self.poll.status_every_s:
                last_status = time.monotonic()
                report, unreachable = await self._check_status(rollout_id, key, unreachable)
                if report is not None:
                    return report

    async def _check_status(
        self, rollout_id: str, key: str, unreachable: int
    ) -> tuple[AgentReport | None, int]:
        """The report if the agent server has it (a server without a store), and how many
        status calls in a row found it unreachable. ``InfrastructureError`` once it no longer
        knows the rollout, or has been unreachable ``max_status_failures`` times in a row."""
        try:
            status = await self._call("GET", f"/v1/rollout/{rollout_id}")
        except OverloadedError:  # busy, so alive
            return None, 0
        except InfrastructureError as exc:
            if self._is_down is not None and await self._is_down():
                # The outage is marked (one warning, one status line): this attempt ends and
                # the rollout waits for the server with the others, this try uncounted.
                raise InfrastructureError(
                    f"agent server {self.url} went down while the rollout ran: {exc}"
                ) from exc
            unreachable += 1
            log.warning(
                "agent server unreachable (%d/%d): %r",
                unreachable,
                self.poll.max_status_failures,
                exc,
                extra={"rollout_id": rollout_id, "stage": "status"},
            )
            if unreachable >= self.poll.max_status_failures:
                raise InfrastructureError(
                    f"agent server {self.url} unreachable for {unreachable} status calls in a "
                    f"row (it died?): {exc}"
                ) from exc
            return None, unreachable
        except RollwayError as exc:
            raise InfrastructureError(f"agent server lost rollout {rollout_id}: {exc}") from exc
        if status.get("run_key") != key:
            raise InfrastructureError(f"agent server runs {rollout_id} under another key")
        report = status.get("report")
        return (AgentReport.model_validate(report) if report else None), 0

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        return await request_json(self._client(), method, f"{self.url}{path}", self.api_key, body)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = new_session(total_s=60)
        return self._session


def _result(report: AgentReport) -> AgentResult:
    """The agent server's outcome as the client's runner expects it from ``run``."""
    if report.status == "completed":
        return AgentResult(report.messages, report.finish_reason or "stop", report.reward)
    reason = report.reason or report.status
    if report.status == "error" and report.error_kind == "engine":
        raise EngineError(reason)
    if report.status == "error" and report.error_kind == "infrastructure":
        raise InfrastructureError(reason)
    if report.status == "cancelled":
        raise InfrastructureError(f"cancelled on the agent server: {reason}")
    return AgentResult(report.messages, "error", None, reason)


def _health(url: str, api_key: str) -> dict[str, Any]:
    """Who is served there; fails early, naming the problem, when the server or key is wrong."""
    try:
        response = httpx.get(
            f"{url.rstrip('/')}/v1/health",
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=10,
        )
    except httpx.HTTPError as exc:
        raise ConfigError(f"no agent server at {url}: {exc}") from exc
    if response.status_code == 401:
        raise ConfigError(f"the agent server at {url} refused the key")
    if response.status_code != 200:
        raise ConfigError(f"the agent server at {url} answered {response.status_code}")
    info = response.json()
    if not isinstance(info, dict) or not info.get("agent"):
        raise ConfigError(f"{url} does not look like a rollway agent server")
    return info


def resolve_agent(
    agent: AgentLoop | type[AgentLoop] | str,
    key: str | None = None,
    poll: PollPolicy | None = None,
) -> AgentLoop:
    """An agent ready to run: ``http(s)://...`` is an agent server, else a validated loop."""
    if isinstance(agent, str) and agent.startswith(("http://", "https://")):
        key = key or os.environ.get("ROLLWAY_AGENT_KEY")
        if not key:
            raise ConfigError(
                f"agent server {agent} needs its key, and none is given: set ROLLWAY_AGENT_KEY "
                "(or --agent-key) to the key `rollway serve-agent` printed or was given",
                param="agent_key",
            )
        return RemoteAgent(agent, api_key=key, poll=poll)
    return ready_agent(agent)
