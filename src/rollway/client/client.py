"""``RolloutClient``: run an agent on tasks through the recording gateway, with limits,
groups, timeouts, retries, rewards, resume and a store. Sync and async."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import os
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from types import TracebackType
from typing import Any

from aiolimiter import AsyncLimiter
from starlette.applications import Starlette

from rollway.agents.base import AgentLoop
from rollway.agents.validate import ready_agent
from rollway.client.batch import BatchItem, group_stats, plan, should_rerun, summarize
from rollway.client.callbacks import CallbackInbox
from rollway.client.future import RolloutFuture
from rollway.client.gateways import GatewayHandle, LocalGateway
from rollway.client.loop import LoopThread
from rollway.client.progress import BatchProgress, summary_table
from rollway.client.remote_agent import PollPolicy, RemoteAgent
from rollway.client.rewards import RewardFn
from rollway.client.rollout import RolloutRunner, RolloutSettings, RolloutSpec, task_key
from rollway.engines.base import ChatEngine, Engine
from rollway.gateway.app import create_app
from rollway.gateway.core import Gateway
from rollway.gateway.factory import build_gateway
from rollway.gateway.protocol import RegisterRequest, parse_model
from rollway.gateway.remote import RemoteGateway
from rollway.gateway.server import LoopServer
from rollway.store.base import Store
from rollway.store.factory import store_from_uri
from rollway.types import RolloutRecord


class RolloutClient:
    """Runs ``agent`` on tasks. ``engine`` is ``"embedded"``, ``"sim"``, an engine spec or
    object, a ready ``Gateway``, or a ``RemoteGateway`` (a shared ``rollway gateway`` server);
    ``**sampling`` (temperature, top_p, max_tokens, ...) is fixed for every rollout.
    Close it (or use ``with``) to stop its loop and engine.

    ``agent`` may be an agent server's URL (``"http://host:port"``, key in ``agent_key`` or
    ``ROLLWAY_AGENT_KEY``): the client then serves its gateway and a callback route on
    ``http_host``:``http_port`` (advertised as ``public_url`` when agent servers reach it by
    another name), and a rollout ends when its report arrives by callback or, with
    ``callback=False`` or when the callback is lost, when ``poll`` finds it in the store."""

    def __init__(
        self,
        agent: AgentLoop | type[AgentLoop] | str,
        engine: str | Engine | ChatEngine | Gateway | RemoteGateway = "embedded",
        *,
        model: str | None = None,
        store: str | Store = "rollway-runs",
        exp_id: str | None = None,
        reward: RewardFn | None = None,
        max_concurrent: int = 16,
        tps_limit: float | None = None,
        max_retry_attempts: int = 3,
        timeout: float | None = None,
        reward_timeout: float = 30.0,
        stop_grace_s: float = 2.0,
        max_turns: int | None = None,
        max_seq_len: int | None = None,
        show_progress: bool = False,
        debug: bool = False,
        serve_http: bool | None = None,
        http_host: str = "127.0.0.1",
        http_port: int = 0,
        public_url: str | None = None,
        agent_key: str | None = None,
        callback: bool = True,
        poll: PollPolicy | None = None,
        **sampling: Any,
    ) -> None:
        self.agent = resolve_agent(agent, agent_key, poll)
        parse_model(RegisterRequest, sampling)  # a typo fails here, not in every rollout
        self.exp_id = exp_id or self.agent.name
        self.store = store if isinstance(store, Store) else store_from_uri(store, self.exp_id)
        self._owns_engine = isinstance(engine, str)
        self.gateway: GatewayHandle = (
            engine
            if isinstance(engine, RemoteGateway)
            else LocalGateway(
                engine if isinstance(engine, Gateway) else build_gateway(engine, model=model)
            )
        )
        self.settings = RolloutSettings(
            exp_id=self.exp_id,
            sampling=sampling,
            max_turns=max_turns,
            max_seq_len=max_seq_len,
            timeout=timeout,
            reward_timeout=reward_timeout,
            stop_grace_s=stop_grace_s,
            max_retry_attempts=max_retry_attempts,
            debug=debug,
        )
        self.reward_fn = reward
        self.show_progress = show_progress
        self.last_summary: dict[str, Any] | None = None
        self._runner = RolloutRunner(self.agent, self.gateway, self.store, self.settings, reward)
        self._slots = asyncio.Semaphore(max_concurrent)
        # Capacity 1 spaces starts evenly (no burst): at most tps_limit in any second.
        self._starts = AsyncLimiter(1, 1.0 / tps_limit) if tps_limit else None
        self._loop = LoopThread()
        self._live: set[RolloutFuture] = set()
        inbox = CallbackInbox() if callback and isinstance(self.agent, RemoteAgent) else None
        if isinstance(self.agent, RemoteAgent):
            self.agent.bind(self.store, inbox, self.settings)
        if serve_http is None:
            serve_http = getattr(self.agent, "needs_http", False)
        self._http = self._serve(serve_http, inbox, (http_host, http_port), public_url)

    # -- single rollouts ---------------------------------------------------------------------

    def invoke(self, task: dict[str, Any], **overrides: Any) -> RolloutFuture:
        """Start one rollout of ``task``; ``overrides`` change sampling for it alone."""
        key = f"{task_key(task)}-{uuid.uuid4().hex[:8]}"
        spec = RolloutSpec(task, 0, key, f"{self.exp_id}:{key}", 0, 0)
        runner = self._runner
        if overrides:
            parse_model(RegisterRequest, overrides)
            sampling = {**self.settings.sampling, **overrides}
            settings = dataclasses.replace(self.settings, sampling=sampling)
            runner = RolloutRunner(self.agent, self.gateway, self.store, settings, self.reward_fn)
        return self._submit(spec, runner)

    async def invoke_async(self, task: dict[str, Any], **overrides: Any) -> RolloutRecord:
        return await self.invoke(task, **overrides)

    # -- batches -----------------------------------------------------------------------------

    def run_batch(
        self, tasks: Iterable[dict[str, Any]], group_size: int = 1, *, resume: bool = True
    ) -> Iterator[BatchItem]:
        """Yield one ``BatchItem`` per rollout (tasks x group_size), in completion order.
        Stopping the iteration early cancels what is still running."""
        started = time.monotonic()
        done, todo = self._prepare(list(tasks), group_size, resume)
        futures = {self._submit(spec, self._runner): index for index, spec in todo}
        records = [item.result for item in done]
        with BatchProgress(len(done) + len(todo), show=self.show_progress) as progress:
            try:
                for item in done:
                    progress.advance(item.result)
                    yield item
                by_cf = {f._future: f for f in futures}
                for cf in concurrent.futures.as_completed(by_cf):
                    future = by_cf[cf]
                    record = cf.result()
                    records.append(record)
                    progress.advance(record)
                    yield BatchItem.of(record, futures[future], future.elapsed())
            finally:
                self._cancel_and_wait(futures)
        self._finish(records, time.monotonic() - started)

    async def run_batch_async(
        self, tasks: Iterable[dict[str, Any]], group_size: int = 1, *, resume: bool = True
    ) -> AsyncIterator[BatchItem]:
        """``run_batch`` as an async iterator."""
        started = time.monotonic()
        done, todo = self._prepare(list(tasks), group_size, resume)
        futures = {self._submit(spec, self._runner): index for index, spec in todo}
        records = [item.result for item in done]
        try:
            for item in done:
                yield item
            waiting = {asyncio.wrap_future(f._future): f for f in futures}
            while waiting:
                finished, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                for aw in finished:
                    future = waiting.pop(aw)
                    record = aw.result()
                    records.append(record)
                    yield BatchItem.of(record, futures[future], future.elapsed())
        finally:
            await asyncio.to_thread(self._cancel_and_wait, futures)
        self._finish(records, time.monotonic() - started)

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Cancel what is running (each gets its ``cancelled`` record), close the engine."""
        if self._loop.loop.is_closed():
            return
        self._cancel_and_wait(list(self._live))
        if self._http is not None:
            self._loop.call(self._http.stop())
        if isinstance(self.agent, RemoteAgent):
            self._loop.call(self.agent.aclose())
        if isinstance(self.gateway, RemoteGateway):
            self._loop.call(self.gateway.close())
        elif self._owns_engine:
            self._loop.call(self.gateway.gateway.engine.close())
        self._loop.close()

    def __enter__(self) -> RolloutClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------

    def _submit(self, spec: RolloutSpec, runner: RolloutRunner) -> RolloutFuture:
        cancel = asyncio.Event()
        cf = self._loop.submit(self._run_limited(spec, runner, cancel))
        future = RolloutFuture(cf, cancel, self._loop.loop)
        self._live.add(future)
        cf.add_done_callback(lambda _: self._live.discard(future))
        return future

    async def _run_limited(
        self, spec: RolloutSpec, runner: RolloutRunner, cancel: asyncio.Event
    ) -> RolloutRecord:
        async with self._slots:
            if self._starts is not None and not cancel.is_set():
                await self._starts.acquire()
            return await runner.run(spec, cancel)

    def _prepare(
        self, tasks: list[dict[str, Any]], group_size: int, resume: bool
    ) -> tuple[list[BatchItem], list[tuple[int, RolloutSpec]]]:
        specs = plan(tasks, group_size, self.exp_id)
        self.store.write_config(self._config(len(tasks), group_size))
        done: list[BatchItem] = []
        todo: list[tuple[int, RolloutSpec]] = []
        for index, spec in enumerate(specs):
            stored = self.store.get(spec.rollout_key) if resume else None
            if should_rerun(stored):
                todo.append((index, spec))
            else:
                done.append(BatchItem.of(stored, index, 0.0, from_store=True))
        return done, todo

    def _cancel_and_wait(self, futures: Iterable[RolloutFuture]) -> None:
        pending = [f for f in futures if not f.done()]
        for future in pending:
            future.cancel()
        concurrent.futures.wait([f._future for f in pending])

    def _finish(self, records: list[RolloutRecord], wall_s: float) -> None:
        groups = [g.to_dict() for g in group_stats(records)]
        self.store.write_summary("groups", {"groups": groups})
        summary = summarize(records, wall_s)
        self.last_summary = summary.to_dict()
        self.store.write_summary("summary", self.last_summary)
        if self.show_progress:
            BatchProgress(0, show=False).console.print(summary_table(summary))

    def _serve(
        self,
        gateway: bool,
        inbox: CallbackInbox | None,
        bind: tuple[str, int],
        public_url: str | None,
    ) -> LoopServer | None:
        """Serve what out-of-process parties need: the in-process gateway (programs, agent
        servers) and the callback route (agent servers). None when nothing is needed."""
        routes = [inbox.route()] if inbox is not None else []
        local = self.gateway if gateway and isinstance(self.gateway, LocalGateway) else None
        if local is not None:
            app = create_app(
                local.gateway, admin_key=secrets.token_hex(16), close_engine=False,
                extra_routes=routes,
            )  # fmt: skip
        elif routes:
            app = Starlette(routes=routes)
        else:
            return None
        # The gateway on a Unix socket too, for sandboxes whose only way out is a relay to it.
        server = LoopServer(app, host=bind[0], port=bind[1], unix_socket=local is not None)
        bound = self._loop.call(server.start())
        url = public_url.rstrip("/") if public_url else bound
        if local is not None:
            local.url, local.socket_path = url, server.unix_path
        if inbox is not None:
            inbox.url = url
        return server

    def _config(self, n_tasks: int, group_size: int) -> dict[str, Any]:
        return {
            "exp_id": self.exp_id,
            "agent": _agent_spec(self.agent),
            "agent_name": self.agent.name,
            "model": self.gateway.model_name,
            "tasks": n_tasks,
            "group_size": group_size,
            **{k: v for k, v in dataclasses.asdict(self.settings).items() if k != "exp_id"},
            "written_at": time.time(),
        }


def resolve_agent(
    agent: AgentLoop | type[AgentLoop] | str,
    key: str | None = None,
    poll: PollPolicy | None = None,
) -> AgentLoop:
    """An agent ready to run: ``http(s)://...`` is an agent server, else a validated loop."""
    if isinstance(agent, str) and agent.startswith(("http://", "https://")):
        return RemoteAgent(agent, api_key=key or os.environ.get("ROLLWAY_AGENT_KEY", ""), poll=poll)
    return ready_agent(agent)


def _agent_spec(agent: AgentLoop) -> str:
    if isinstance(agent, RemoteAgent):
        return agent.url
    return f"{type(agent).__module__}:{type(agent).__qualname__}"
