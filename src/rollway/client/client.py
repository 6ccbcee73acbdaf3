"""``RolloutClient``: run an agent on tasks through the recording gateway, with limits,
groups, timeouts, retries, rewards, resume and a store. Sync and async."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from types import TracebackType
from typing import Any

from aiolimiter import AsyncLimiter

from rollway.agents.base import AgentLoop
from rollway.agents.registry import load_agent
from rollway.agents.validate import validate
from rollway.client.batch import BatchItem, group_stats, plan, should_rerun, summarize
from rollway.client.future import RolloutFuture
from rollway.client.loop import LoopThread
from rollway.client.progress import BatchProgress, summary_table
from rollway.client.rewards import RewardFn
from rollway.client.rollout import RolloutRunner, RolloutSettings, RolloutSpec, task_key
from rollway.engines.base import ChatEngine, Engine
from rollway.errors import AgentError
from rollway.gateway.app import create_app
from rollway.gateway.core import Gateway
from rollway.gateway.factory import build_gateway
from rollway.gateway.protocol import RegisterRequest, parse_model
from rollway.gateway.server import LoopServer
from rollway.store.base import Store
from rollway.store.factory import store_from_uri
from rollway.types import RolloutRecord


class RolloutClient:
    """Runs ``agent`` on tasks. ``engine`` is ``"embedded"``, ``"sim"``, an engine object or a
    ready ``Gateway``; ``**sampling`` (temperature, top_p, max_tokens, ...) is fixed for every
    rollout. Close it (or use ``with``) to stop its loop and engine."""

    def __init__(
        self,
        agent: AgentLoop | type[AgentLoop] | str,
        engine: str | Engine | ChatEngine | Gateway = "embedded",
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
        **sampling: Any,
    ) -> None:
        self.agent = _ready_agent(agent)
        parse_model(RegisterRequest, sampling)  # a typo fails here, not in every rollout
        self.exp_id = exp_id or self.agent.name
        self.store = store if isinstance(store, Store) else store_from_uri(store, self.exp_id)
        self._owns_engine = isinstance(engine, str)
        self.gateway = engine if isinstance(engine, Gateway) else build_gateway(engine, model=model)
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
        # Out-of-process agents (programs) reach the gateway over HTTP on loopback.
        self._http: LoopServer | None = None
        if serve_http if serve_http is not None else getattr(self.agent, "needs_http", False):
            app = create_app(self.gateway, admin_key=secrets.token_hex(16), close_engine=False)
            self._http = LoopServer(app)
            self._runner.gateway_url = self._loop.call(self._http.start())

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
            runner.gateway_url = self._runner.gateway_url
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
        if self._owns_engine:
            self._loop.call(self.gateway.engine.close())
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

    def _config(self, n_tasks: int, group_size: int) -> dict[str, Any]:
        return {
            "exp_id": self.exp_id,
            "agent": f"{type(self.agent).__module__}:{type(self.agent).__qualname__}",
            "agent_name": self.agent.name,
            "model": self.gateway.model_name,
            "tasks": n_tasks,
            "group_size": group_size,
            **{k: v for k, v in dataclasses.asdict(self.settings).items() if k != "exp_id"},
            "written_at": time.time(),
        }


def _ready_agent(agent: AgentLoop | type[AgentLoop] | str) -> AgentLoop:
    """An agent instance that passed ``validate``; else ``AgentError`` listing the problems."""
    if isinstance(agent, str):
        agent = load_agent(agent)
    errors = [i for i in validate(agent) if i.severity == "error"]
    if errors:
        listed = "; ".join(f"{i.code} {i.message}" for i in errors)
        raise AgentError(f"agent is not ready: {listed}")
    return agent if isinstance(agent, AgentLoop) else agent()
