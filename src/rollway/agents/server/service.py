"""The agent server's core: start rollouts of one agent in the background, at most
``max_concurrent`` at a time, once per idempotency key; cancel them; report each outcome to the
store and to the client's callback; forget finished ones after a TTL.

The HTTP layer (``app.py``) is a thin shell over ``AgentService``; tests drive either."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from rollway import tracing
from rollway.agents.base import AgentLoop
from rollway.agents.context import RolloutContext
from rollway.agents.execution import AgentOutcome, run_agent
from rollway.agents.server.agent_schema import InitRequest
from rollway.agents.server.report_sender import Delivery, deliver_report
from rollway.errors import (
    InvalidFieldsError,
    OverloadedError,
    RolloutClosedError,
    UnknownRolloutError,
)
from rollway.gateway.remote_gateway import HttpChat
from rollway.logs import log_stage
from rollway.results import AgentReport
from rollway.store.base import Store
from rollway.store.factory import store_from_uri
from rollway.web.http_client import new_session

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentServerConfig:
    #: Where reports go (``file://``, a folder, ``s3://...``); None keeps them in memory only.
    store: str | None = None
    max_concurrent: int = 64
    #: How long a finished rollout stays answerable (status, idempotent init) in memory.
    ttl_s: float = 3600.0
    callback_attempts: int = 5
    callback_wait_s: float = 0.5
    #: A stopped agent's time to return before its task is cancelled.
    stop_grace_s: float = 2.0
    #: Suggested wait for a client refused at capacity.
    retry_after_s: float = 1.0
    #: Per-rollout debug JSONL goes here when an init asks for it.
    debug_dir: Path | None = None


@dataclass(eq=False)
class Run:
    key: str
    init: InitRequest
    tools: list[dict[str, Any]]
    report: AgentReport
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    callback: Delivery = "none"
    finished_at: float | None = None  # monotonic, for the TTL
    task: asyncio.Task[None] | None = None


class AgentService:
    def __init__(self, agent: AgentLoop, config: AgentServerConfig | None = None) -> None:
        self.agent = agent
        self.config = config or AgentServerConfig()
        #: How many rollouts this server has started (an idempotent repeat starts none).
        self.runs_started = 0
        self._runs: dict[str, Run] = {}
        self._latest: dict[str, str] = {}  # rollout id -> run key
        self._stores: dict[str, Store] = {}
        self._session: aiohttp.ClientSession | None = None

    @property
    def running(self) -> int:
        return sum(1 for run in self._runs.values() if run.finished_at is None)

    async def start(self, init: InitRequest) -> tuple[Run, bool]:
        """The run for ``init`` and whether this call started it."""
        self._sweep()
        key = init.idempotency_key or f"{init.rollout_id}-{uuid.uuid4().hex[:12]}"
        if key in self._runs:
            run = self._runs[key]
            _check_same_rollout(run.init, init, key)
            if run.finished_at is None and init.callback_url:
                # A restarted client re-attaching: call back where it listens now.
                callback = {"callback_url": init.callback_url, "callback_key": init.callback_key}
                run.init = run.init.model_copy(update=callback)
            return run, False
        stored = await self._stored_report(init.exp_id, key)
        if stored is not None:  # finished and forgotten (TTL) or started before a restart
            if stored.rollout_id != init.rollout_id:
                raise _key_reused(
                    key, f"{init.exp_id}/{stored.rollout_id}", f"{init.exp_id}/{init.rollout_id}"
                )
            run = Run(key, init, [], stored, callback="none", finished_at=time.monotonic())
            self._remember(run)
            return run, False
        previous = self._runs.get(self._latest.get(init.rollout_id, ""))
        if previous is not None and previous.finished_at is None:
            raise RolloutClosedError(
                f"rollout {init.rollout_id!r} is already running under another idempotency key"
            )
        if self.running >= self.config.max_concurrent:
            raise OverloadedError(
                f"at capacity ({self.config.max_concurrent} rollouts running)",
                retry_after_s=self.config.retry_after_s,
            )
        tools = self._tools(init)
        report = AgentReport(
            run_key=key,
            rollout_id=init.rollout_id,
            agent=self.agent.name,
            status="running",
            started_at=time.time(),
        )
        run = Run(key, init, tools, report)
        self._remember(run)
        self.runs_started += 1
        run.task = asyncio.create_task(self._execute(run), name=f"rollout {init.rollout_id}")
        run.task.add_done_callback(functools.partial(_record_crash, run))
        return run, True

    def get(self, rollout_id: str) -> Run:
        run = self._runs.get(self._latest.get(rollout_id, ""))
        if run is None:
            raise UnknownRolloutError(f"no rollout {rollout_id!r} is known here")
        return run

    def cancel(self, rollout_id: str) -> Run:
        run = self.get(rollout_id)
        run.cancel.set()
        return run

    async def close(self) -> None:
        """Cancel what runs (each still reports ``cancelled``), wait, close connections."""
        tasks = [r.task for r in self._runs.values() if r.task is not None and not r.task.done()]
        for run in self._runs.values():
            run.cancel.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = new_session()
        return self._session

    # -- internals ---------------------------------------------------------------------------

    async def _execute(self, run: Run) -> None:
        init = run.init
        extra = {"rollout_id": init.rollout_id}
        log_stage(log, "start_agent", init.rollout_id, logging.INFO, run_key=run.key)
        attributes = {"rollway.rollout_id": init.rollout_id, "rollway.agent": self.agent.name}
        with tracing.span("rollway.agent.run", attributes) as span:
            try:
                outcome = await self._run_agent(run)
            except Exception as exc:  # a bug here must still end in a report
                log.exception("agent server failed", extra=extra)
                outcome = AgentOutcome("error", "infrastructure", f"agent server: {exc!r}")
            span.set({"rollway.status": outcome.status})
        report = self._report(run, outcome)
        await self._save(run.init, report)
        # Published only once stored: whoever sees "finished" can also read it from the store.
        callback_url, callback_key = run.init.callback_url, run.init.callback_key
        run.callback = "pending" if callback_url else "none"
        run.report, run.finished_at = report, time.monotonic()
        log_stage(log, "finish", init.rollout_id, logging.INFO, status=outcome.status)
        if callback_url:
            run.callback = await deliver_report(
                self.session(),
                callback_url,
                callback_key,
                report,
                attempts=self.config.callback_attempts,
                wait_s=self.config.callback_wait_s,
            )

    async def _run_agent(self, run: Run) -> AgentOutcome:
        init = run.init
        chat = HttpChat(self.session(), init.base_url, init.api_key, init.model or "default")
        ctx = RolloutContext(
            init.task,
            run.tools,
            init.rollout_id,
            chat,
            self._debug_path(init),
            base_url=init.base_url,
            api_key=init.api_key,
        )
        outcome = await run_agent(
            self.agent,
            ctx,
            cancel=run.cancel,
            timeout_s=init.limits.timeout_s,
            stop_grace_s=self.config.stop_grace_s,
        )
        run.report.metrics = ctx.metrics
        return outcome

    def _report(self, run: Run, outcome: AgentOutcome) -> AgentReport:
        result = outcome.result
        return run.report.model_copy(
            update={
                "status": outcome.status,
                "error_kind": outcome.kind,
                "reason": outcome.reason,
                "messages": result.messages if result else [],
                "finish_reason": result.finish_reason if result else None,
                "reward": result.reward if result else None,
                "finished_at": time.time(),
            }
        )

    async def _save(self, init: InitRequest, report: AgentReport) -> None:
        store = self._store(init.exp_id)
        if store is None:
            return
        try:
            await asyncio.to_thread(store.write_report, report)
        except Exception as exc:  # the callback and the status route may still deliver it
            log.warning("report not stored: %r", exc, extra={"rollout_id": init.rollout_id})

    async def _stored_report(self, exp_id: str, key: str) -> AgentReport | None:
        store = self._store(exp_id)
        if store is None:
            return None
        return await asyncio.to_thread(store.get_report, key)

    def _store(self, exp_id: str) -> Store | None:
        if self.config.store is None:
            return None
        if exp_id not in self._stores:
            self._stores[exp_id] = store_from_uri(self.config.store, exp_id)
        return self._stores[exp_id]

    def _tools(self, init: InitRequest) -> list[dict[str, Any]]:
        tools = self.agent.get_tools(init.task)
        if init.tools is None:
            return tools
        names = {t["function"]["name"] for t in tools}
        unknown = sorted(set(init.tools) - names)
        if unknown:
            raise InvalidFieldsError(
                f"tools: the agent has no tool named {', '.join(map(repr, unknown))}",
                param="tools",
            )
        return [t for t in tools if t["function"]["name"] in init.tools]

    def _debug_path(self, init: InitRequest) -> Path | None:
        if not init.debug or self.config.debug_dir is None:
            return None
        self.config.debug_dir.mkdir(parents=True, exist_ok=True)
        return self.config.debug_dir / f"{init.rollout_id}.jsonl"

    def _remember(self, run: Run) -> None:
        self._runs[run.key] = run
        self._latest[run.init.rollout_id] = run.key

    def _sweep(self) -> None:
        cutoff = time.monotonic() - self.config.ttl_s
        for key, run in list(self._runs.items()):
            if run.finished_at is not None and run.finished_at < cutoff:
                del self._runs[key]
                if self._latest.get(run.init.rollout_id) == key:
                    del self._latest[run.init.rollout_id]


def _record_crash(run: Run, task: asyncio.Task[None]) -> None:
    """A run whose task failed past its own handling (a bug) still ends, as an infrastructure
    error: else its status would say running, or its callback pending, for good."""
    if task.cancelled() or task.exception() is None:
        return
    error = task.exception()
    log.error("agent server run failed: %r", error, extra={"rollout_id": run.init.rollout_id})
    if run.finished_at is None:
        update = {
            "status": "error",
            "error_kind": "infrastructure",
            "reason": f"agent server: {error!r}",
            "finished_at": time.time(),
        }
        run.report, run.finished_at = run.report.model_copy(update=update), time.monotonic()
    if run.callback == "pending":
        run.callback = "failed"


def _check_same_rollout(started: InitRequest, init: InitRequest, key: str) -> None:
    """An idempotency key names one rollout of one experiment: reusing it for another must
    not hand back that other rollout's run."""
    if (started.rollout_id, started.exp_id) != (init.rollout_id, init.exp_id):
        raise _key_reused(
            key, f"{started.exp_id}/{started.rollout_id}", f"{init.exp_id}/{init.rollout_id}"
        )


def _key_reused(key: str, owner: str, asked: str) -> RolloutClosedError:
    return RolloutClosedError(
        f"idempotency key {key!r} belongs to rollout {owner!r} (experiment/rollout), not {asked!r}",
        param="idempotency_key",
    )
