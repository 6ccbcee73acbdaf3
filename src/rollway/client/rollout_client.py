"""``RolloutClient``: run an agent on tasks through the recording gateway, with limits,
groups, timeouts, retries, rewards, resume and a store. Sync and async."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from types import TracebackType
from typing import Any, Unpack

from rollway import tracing
from rollway.agents.base import AgentLoop
from rollway.agents.server.remote_agent import PollPolicy
from rollway.checks import check_count
from rollway.client.admission import Admission
from rollway.client.batch import BatchItem
from rollway.client.batch_runs import BatchRequest, BatchRuns, cancel_and_wait
from rollway.client.client_config import ClientConfig, Pacing
from rollway.client.event_stream import DEFAULT_QUEUE_SIZE, ClientEvents, EventListener
from rollway.client.fingerprint import fingerprint
from rollway.client.future import CancelGate, RolloutFuture, recorded
from rollway.client.lease_keeper import LeaseKeeper
from rollway.client.policy_tracker import PolicyTracker
from rollway.client.progress import DEFAULT_STATUS_INTERVAL_S
from rollway.client.rescore import RescoreReport, rescore_async
from rollway.client.step_plan import step_plan
from rollway.client.step_source import StepHooks, StepSource
from rollway.client.task_sources import Tasks, read_tasks
from rollway.client.watchdog import DEFAULT_STUCK_AFTER_S, Watchdog
from rollway.engines.base import WeightSource
from rollway.errors import ConfigError
from rollway.events import EventSink
from rollway.executors import Executor, LocalExecutor, WorkerConfig, executor_from
from rollway.gateway.engine_choice import EngineArgument, EngineChoice
from rollway.gateway.handle import GatewayHandle
from rollway.gateway.weight_control import NewWeights
from rollway.generation import SamplingParams
from rollway.loop_thread import LoopThread
from rollway.results import RolloutRecord
from rollway.retry import RetryPolicy
from rollway.rollouts import (
    RolloutConfig,
    RolloutLimits,
    RolloutOptions,
    RolloutSpec,
    ServingConfig,
    task_key,
)
from rollway.rollouts.rewards import RewardFn
from rollway.sandbox import remove_leftovers
from rollway.sandbox.environment import check_environment
from rollway.store.base import Store
from rollway.store.factory import store_from_uri

log = logging.getLogger(__name__)


class RolloutClient:
    """Runs ``agent`` on tasks. ``engine`` is ``"embedded"``, ``"sim"``, an engine spec or
    object, a ready ``Gateway``, or a ``RemoteGateway`` (a shared ``rollway gateway`` server).
    Close it (or use ``with``) to stop its loop and engine.

    How each rollout runs comes in config objects: ``sampling`` (a ``SamplingParams``, or a
    mapping that fixes only the fields it names), ``limits`` (``RolloutLimits``: turns, tokens,
    a 900 s ``timeout`` by default), ``retry`` (``RetryPolicy``). The common settings are also
    keywords (``RolloutOptions``): ``temperature=1.0, max_tokens=256, max_turns=8,
    timeout=120, max_retry_attempts=2``; a setting given both ways is an error. ``invoke`` and
    ``run_batch`` take the same keywords for one rollout or one batch.

    ``agent`` may be an agent server's URL (``"http://host:port"``, key in ``agent_key`` or
    ``ROLLWAY_AGENT_KEY``): the client then serves its gateway and a callback route as
    ``serving`` says (``ServingConfig``: host, port, the public URL agent servers reach it by),
    and a rollout ends when its report arrives by callback or, with
    ``ServingConfig(callback=False)`` or when the callback is lost, when ``poll`` finds it in the
    store.

    ``executor`` is where rollouts run: ``"local"`` (this process), ``"ray"`` or a
    ``RayExecutor(...)`` (worker actors on a Ray cluster; records come back light, their
    trajectories are in the store). The cap and the rate limit hold across all of them. A batch
    shows a bar with ``show_progress`` and a status line every ``status_interval`` seconds.

    In a training loop, ``update_weights`` puts new weights into every engine the rollouts
    sample from (pausing starts meanwhile) and bumps the policy version stamped on each token;
    ``max_staleness=k`` restarts a running rollout that an update leaves more than ``k``
    versions behind (asynchronous RL).

    ``events()`` streams what happens (``client.event_stream``); ``on_event`` hears each event
    on the client's thread. A rollout without progress for ``stuck_after_s`` seconds (300; None:
    never) is reported, with ``abort_stuck`` ended as a ``timeout`` (``client.watchdog``).
    ``trace=True`` (or ``ROLLWAY_TRACE=1``): OpenTelemetry spans (``rollway.tracing``)."""

    def __init__(
        self,
        agent: AgentLoop | type[AgentLoop] | str,
        engine: EngineArgument = "embedded",
        *,
        model: str | None = None,
        store: str | Store = "rollway-runs",
        exp_id: str | None = None,
        reward: RewardFn | None = None,
        sampling: SamplingParams | Mapping[str, Any] | None = None,
        limits: RolloutLimits | Mapping[str, Any] | None = None,
        retry: RetryPolicy | Mapping[str, Any] | None = None,
        serving: ServingConfig | Mapping[str, Any] | None = None,
        max_concurrent: int = 16,
        tps_limit: float | None = None,
        executor: str | Executor = "local",
        agent_key: str | None = None,
        poll: PollPolicy | None = None,
        max_staleness: int | None = None,
        debug: bool = False,
        show_progress: bool = False,
        status_interval: float = DEFAULT_STATUS_INTERVAL_S,
        on_event: EventSink | None = None,
        stuck_after_s: float | None = DEFAULT_STUCK_AFTER_S,
        abort_stuck: bool = False,
        trace: bool = False,
        **options: Unpack[RolloutOptions],
    ) -> None:
        # Grouped and checked before anything starts: a bad value is named here, not met as a
        # hang later.
        pacing = Pacing(
            max_concurrent, tps_limit, show_progress, status_interval, stuck_after_s, abort_stuck
        )
        config = ClientConfig.build(
            agent,
            exp_id,
            engine=EngineChoice.of(engine, model),
            pacing=pacing,
            agent_key=agent_key,
            poll=poll,
            trace=trace,
            serving=serving,
            sampling=sampling,
            limits=limits,
            retry=retry,
            debug=debug,
            options=options,
        )
        self.agent, self.exp_id, self.settings = config.agent, config.exp_id, config.settings
        self.store = store if isinstance(store, Store) else store_from_uri(store, self.exp_id)
        remove_leftovers()  # what killed clients left: sandbox folders, gateway sockets
        self.reward_fn = reward
        check_environment(reward, self.agent)
        self.pacing = config.pacing
        #: Rollouts running, by their concurrent future.
        self._live: dict[concurrent.futures.Future[RolloutRecord], RolloutFuture] = {}
        self.policy = PolicyTracker(max_staleness)
        self.executor = executor_from(executor)
        self._watch(on_event)
        self._start(config.engine, config.serving, following=max_staleness is not None)

    def _watch(self, on_event: EventSink | None) -> None:
        """The parts that watch rollouts: events, admission (the cap and the rate), the
        watchdog."""
        pacing = self.pacing
        self._events = ClientEvents()
        self._admission = Admission(
            self.executor, self.policy, self._events, pacing.max_concurrent, pacing.tps_limit
        )
        if on_event is not None:
            self._events.bus.subscribe(on_event)
        self._watchdog = Watchdog(
            self.executor, self._events.bus, pacing.watch_after_s, pacing.abort_stuck
        )

    def _start(
        self,
        engine: EngineChoice,
        serving: ServingConfig,
        *,
        following: bool,
    ) -> None:
        """Start the executor (its engine and gateway) on the client's own loop, then the
        watchdog, with a staleness bound (``following``) the policy follower, and batches."""
        setup = WorkerConfig(
            agent=self.agent,
            engine=engine,
            store=self.store,
            settings=self.settings,
            reward=self.reward_fn,
            serving=serving,
            trace=tracing.enabled(),
        )
        # Batches hold the experiment: another live client's batch would run, cancel and
        # unregister the same rollouts. Made before the executor ships the gateway to workers.
        self._lease = LeaseKeeper(self.exp_id, self.store, engine.shared)
        self._loop = LoopThread()
        try:
            self.executor.start(setup, self._loop, self._events.bus)
            self.policy.version = self._loop.call(self.executor.policy()).version
        except BaseException:
            self.executor.close(self._loop)
            self._loop.close()
            raise
        self._updating = asyncio.Lock()
        self._watching = self._loop.submit(self._watchdog.watch_forever())
        # Updates can come from elsewhere (POST /admin/weights on a shared gateway): with a
        # staleness bound, the client follows the engines' version.
        self._following = self._loop.submit(self._follow_policy()) if following else None
        self._batches = BatchRuns(
            exp_id=self.exp_id,
            agent=self.agent,
            store=self.store,
            executor=self.executor,
            submit=self._submit,
            lease=self._lease,
            loop=self._loop,
            watchdog=self._watchdog,
        )

    @property
    def gateway(self) -> GatewayHandle:
        """The gateway rollouts run through (in this process: the local executor's)."""
        if not isinstance(self.executor, LocalExecutor):
            raise AttributeError("with a Ray executor each worker has its own gateway handle")
        return self.executor.gateway

    def events(self, max_queued: int = DEFAULT_QUEUE_SIZE) -> EventListener:
        """Subscribe to rollout events from now on (``async for event in client.events()``);
        close it (or ``async with``) to stop. A listener that falls behind loses events, counted
        in an ``EventsDropped`` notice where they would have been: it never slows the
        rollouts."""
        check_count("max_queued", max_queued, least=1)
        return self._events.listen(max_queued)

    # -- single rollouts ---------------------------------------------------------------------

    def invoke(self, task: dict[str, Any], **overrides: Unpack[RolloutOptions]) -> RolloutFuture:
        """Start one rollout of ``task``; ``overrides`` (sampling fields, limits,
        ``max_retry_attempts``) change it alone. Anything else is refused, naming it."""
        self._check_open()
        if not isinstance(task, dict):
            raise ConfigError(f"task must be a dict, not {type(task).__name__}", "task")
        settings = self.settings.with_options(overrides)
        run = uuid.uuid4().hex
        stable = task_key(task)
        key = f"{stable}-{run[:8]}"
        spec = RolloutSpec(
            task,
            0,
            key,
            f"{self.exp_id}:{key}",
            0,
            0,
            run_id=run,
            seed_key=f"{stable}.0",
            fingerprint=self._fingerprint(settings),
        )
        return self._submit(spec, settings)

    async def invoke_async(
        self, task: dict[str, Any], **overrides: Unpack[RolloutOptions]
    ) -> RolloutRecord:
        """Run one rollout of ``task`` and return its ``RolloutRecord`` (whatever the outcome;
        awaitable from any event loop). Cancelling the awaiting task cancels the rollout, which
        is then recorded as ``cancelled``."""
        return await self.invoke(task, **overrides).result_async()

    # -- weights -----------------------------------------------------------------------------

    @property
    def policy_version(self) -> int | None:
        """The weights version new rollouts sample from (None: the engine has no versions)."""
        return self.policy.version

    def update_weights(
        self, source: WeightSource, version: int | None = None, *, mode: str = "abort"
    ) -> dict[str, Any]:
        """Load new weights into every engine the rollouts use, as ``version`` (default: the
        next). ``source``: a checkpoint folder (every engine; a path on the servers for remote
        ones) or a state dict (an in-process embedded engine, or Ray workers' own). ``mode``:
        ``abort`` (turns in flight stop and are sent again under the new weights; the agent
        sees a slower turn), ``drain`` (they finish on the old weights first) or ``keep``
        (they freeze and go on under the new ones). Rollout starts wait meanwhile. Safe to
        call from another thread while a batch runs. Returns what the update did:
        ``policy_version``, ``mode``, ``pause_s``, ``load_s`` and ``stale_restarts``."""
        self._check_open("to update weights")
        return self._loop.call(self._update_weights(NewWeights.of(source, version, mode)))

    async def update_weights_async(
        self, source: WeightSource, version: int | None = None, *, mode: str = "abort"
    ) -> dict[str, Any]:
        """``update_weights`` for a trainer in an event loop: awaitable from any loop, which
        goes on while the update runs on the client's own."""
        self._check_open("to update weights")
        new = NewWeights.of(source, version, mode)
        return await asyncio.wrap_future(self._loop.submit(self._update_weights(new)))

    async def _follow_policy(self, every_s: float = 1.0) -> None:
        while True:
            await asyncio.sleep(every_s)
            try:
                version = (await self.executor.policy()).version
            except Exception as exc:  # the gateway is down: rollouts will say so
                log.debug("policy check failed: %r", exc)
                continue
            if version is not None and (
                self.policy.version is None or version > self.policy.version
            ):
                self.policy.advance(version)

    async def _update_weights(self, new: NewWeights) -> dict[str, Any]:
        async with self._updating:
            self.policy.hold_starts()
            try:
                update = await self.executor.update_weights(new)
            finally:
                self.policy.open_starts()
            stale_restarts = self.policy.advance(update.version)
        return {**update.to_dict(), "stale_restarts": stale_restarts}

    # -- batches -----------------------------------------------------------------------------

    def run_batch(
        self,
        tasks: Tasks,
        group_size: int = 1,
        *,
        resume: bool = True,
        **overrides: Unpack[RolloutOptions],
    ) -> Iterator[BatchItem]:
        """Yield one ``BatchItem`` per rollout (tasks x group_size), in completion order;
        ``tasks`` are rows, a JSONL file or a task source's spec (``reasoning-gym:NAME?...``,
        ``client.task_sources``); ``overrides`` (as for ``invoke``) change this batch alone.
        Stopping the iteration early cancels what is still running. A ``KeyboardInterrupt``
        inside the batch (Ctrl-C while it waits) cancels what is running, writes the summary
        of what finished (``last_summary["interrupted"]``), and is raised again."""
        # Refused now, not at the first item.
        return self._batches.run(self._batch_request(tasks, group_size, resume, overrides))

    def run_batch_async(
        self,
        tasks: Tasks,
        group_size: int = 1,
        *,
        resume: bool = True,
        **overrides: Unpack[RolloutOptions],
    ) -> AsyncIterator[BatchItem]:
        """``run_batch`` as an async iterator."""
        return self._batches.run_async(self._batch_request(tasks, group_size, resume, overrides))

    def _batch_request(
        self,
        tasks: Tasks,
        group_size: int,
        resume: bool,
        overrides: Mapping[str, Any],
    ) -> BatchRequest:
        """A batch's settings and tasks, checked before it starts."""
        self._check_open()
        check_count("group_size", group_size, least=1)
        settings = self.settings.with_options(overrides)
        listed = list(read_tasks(tasks))
        for index, task in enumerate(listed):
            if not isinstance(task, dict):
                raise ConfigError(
                    f"tasks[{index}] must be a dict, not {type(task).__name__}", "tasks"
                )
        return BatchRequest(
            listed,
            group_size,
            resume,
            settings,
            self._fingerprint(settings),
            self.pacing.show_progress,
            self.pacing.status_interval,
        )

    def step_source(
        self,
        tasks: Tasks,
        *,
        group_size: int,
        groups_per_step: int,
        over_sample: float = 0.0,
        dynamic_sampling: bool = True,
        max_extra_groups: int | None = None,
        max_refills: int = 2,
        max_staleness: int | None = None,
        stale: str = "restart",
        unscored: str = "refill",
        prefetch: bool = False,
        epochs: int = 1,
        resume: bool = True,
        **overrides: Unpack[RolloutOptions],
    ) -> StepSource:
        """A trainer's batches (``client.step_source``): ``groups_per_step`` whole groups of
        ``group_size`` each step (``tasks`` as for ``run_batch``), as soon as they are done;
        ``for batch in source`` or ``async for``. ``over_sample``: keep up to
        ``groups_per_step * (1 + over_sample)`` groups going (what runs at a hand-over goes on
        into the next step). ``dynamic_sampling``: set flat
        groups aside, at most ``max_extra_groups`` a step (default ``groups_per_step``).
        ``max_refills``: fresh attempts per sample lost to the infrastructure.
        ``max_staleness`` (default: the client's) and ``stale`` (``restart``, ``drop``,
        ``keep``): what becomes of a rollout that far behind the weights. ``unscored``
        (``refill``, ``hand``): what becomes of a sample that ended without a reward (a
        timeout, a failed reward, an agent error). ``prefetch``: start
        groups while the trainer trains too (asynchronous RL). ``resume``: skip the tasks the
        store says were settled. ``overrides`` as for ``run_batch``."""
        self._check_open()
        plan = step_plan(
            self.policy.max_staleness,
            group_size=group_size,
            groups_per_step=groups_per_step,
            over_sample=over_sample,
            dynamic_sampling=dynamic_sampling,
            max_extra_groups=max_extra_groups,
            max_refills=max_refills,
            max_staleness=max_staleness,
            stale=stale,
            prefetch=prefetch,
            settings=self.settings.with_options(overrides),
            unscored=unscored,
        )
        hooks = StepHooks(
            exp_id=self.exp_id,
            store=self.store,
            policy=self.policy,
            submit=self._submit,
            fingerprint=self._fingerprint,
            lease=lambda: self._lease.held(self._loop),
            events=self._events.bus,
            status_interval=self.pacing.status_interval,
        )
        return StepSource(hooks, plan, read_tasks(tasks), epochs=epochs, resume=resume)

    def _fingerprint(self, settings: RolloutConfig) -> dict[str, Any]:
        """What rollouts started now are made with (``client.fingerprint``): the policy version
        at the call, so a batch after ``update_weights`` never returns older records."""
        return fingerprint(
            agent=self.agent,
            model=self.executor.model_name,
            reward=self.reward_fn,
            settings=settings,
            policy_version=self.policy.version,
        )

    def rescore(
        self,
        reward: RewardFn | None = None,
        *,
        failed_only: bool = False,
        again: bool = False,
        replace_on_failure: bool = False,
    ) -> RescoreReport:
        """Score this experiment's stored rollouts again with ``reward`` (default: the
        client's), running none (docs/agents.md#rescoring-a-recorded-run); refused while a
        batch of this client (or another) runs."""
        self._check_open("to rescore")
        reward_fn = reward or self.reward_fn
        if reward_fn is None:
            raise ConfigError("rescore needs a reward function: reward=...", "reward")
        return self._loop.call(
            rescore_async(
                self.store,
                reward_fn,
                failed_only=failed_only,
                again=again,
                replace_on_failure=replace_on_failure,
                limits=self.settings.limits,
                # A judge of the policy's engine asks it here; Ray workers' gateways are theirs.
                gateway=self.executor.gateway if isinstance(self.executor, LocalExecutor) else None,
            )
        )

    @property
    def last_summary(self) -> dict[str, Any] | None:
        """The summary of the last batch that ended (None before any)."""
        return self._batches.last_summary

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Cancel what is running (each gets its ``cancelled`` record), close the engine."""
        if self._loop.loop.is_closed():
            return
        if self._following is not None:
            self._following.cancel()
        self._watching.cancel()
        cancel_and_wait(list(self._live.values()))
        self._lease.close(self._loop)  # every rollout has ended
        try:
            self.executor.close(self._loop)
        finally:
            self._loop.close()
            self._events.close()

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

    def _check_open(self, purpose: str = "to run rollouts") -> None:
        # Before any coroutine is made: a closed loop would leave it never awaited.
        if self._loop.loop.is_closed():
            raise ConfigError(f"this client is closed: make a new one {purpose}")

    def _submit(self, spec: RolloutSpec, settings: RolloutConfig) -> RolloutFuture:
        gate = CancelGate(self._loop.loop)
        cf = self._loop.submit(self._run_settled(spec, settings, gate))
        future = RolloutFuture(cf, gate)
        # By its concurrent future, let go by the dict's own method: a callback holding the
        # handle would keep it and its record in a cycle once done (see ``RolloutFuture``).
        self._live[cf] = future
        cf.add_done_callback(self._live.pop)
        return future

    async def _run_settled(
        self, spec: RolloutSpec, settings: RolloutConfig, gate: CancelGate
    ) -> RolloutRecord:
        running = self._admission.run(spec, settings, gate.event)
        record = await recorded(running, spec, settings, self.store)
        record = await gate.settle(record, self.store)  # a cancel granted meanwhile wins
        self._events.finished(record)
        return record
