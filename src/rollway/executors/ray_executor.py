"""Rollouts on a Ray cluster: long-lived worker actors, each running many rollouts at once on
its own event loop, fed by the driver (the client) one rollout at a time to the least-loaded
live worker. The client's concurrency cap and rate limit sit in front of this, so they hold
for the whole cluster.

Records go to the shared store from the workers; the driver gets light copies (outcome,
reward, figures; no trajectory). A worker that dies has its in-flight rollouts dispatched again
(up to ``max_requeues`` times, then recorded as infrastructure errors); Ray restarts the actor
(up to ``max_worker_restarts`` times). A rollout whose dead worker had already stored its
record is not run again."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from typing import Any, Literal

from rollway.errors import ConfigError, ErrorKind, InfrastructureError
from rollway.events import EventBus
from rollway.executors.base import WorkerConfig
from rollway.executors.ray_chunks import CallLost, ChunkedCalls
from rollway.executors.ray_connect import join_cluster
from rollway.executors.ray_connect import ray_start_error as ray_start_error
from rollway.executors.ray_workers import WORKER_RESTART as WORKER_RESTART
from rollway.executors.ray_workers import (
    RayWorker,
    catch_up,
    check_shippable,
    pinned_to,
    ray_cause,
    task_error,
    wait_for_restart,
    worker_nodes,
)
from rollway.executors.worker import RolloutWorker
from rollway.gateway.engine_choice import EngineChoice
from rollway.gateway.weight_control import NewWeights, PolicyState, WeightUpdate
from rollway.logs import log_stage
from rollway.loop_thread import LoopThread
from rollway.results import RolloutRecord
from rollway.retry import RetryPolicy
from rollway.rollouts import RolloutConfig, RolloutSpec, attempt_id, make_record
from rollway.store.base import Store

#: A rollout whose Ray worker died, dispatched to another: three dispatches in all (the Ray
#: executor names its worker-lost error and sets ``attempts`` from ``max_requeues``).
WORKER_REDISPATCH = RetryPolicy(attempts=3)

log = logging.getLogger(__name__)


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "executor='ray' needs Ray, which is not installed: pip install 'rollway[ray]'"
        ) from None
    return ray


class _WorkerLost(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RayExecutor:
    """``address``: a Ray cluster (``"auto"``, ``"ray://head:10001"``; None: ``RAY_ADDRESS``,
    else a local one of its own, unless Ray is already initialised). ``num_workers``: actors
    (default: the cluster's CPUs over each worker's). ``workers_per_node``: instead, that many
    workers pinned to each live node with room for one (node affinity), so a lost node takes
    only its own.
    ``resources_per_worker``: ``{"CPU": 1, "GPU": 0, "memory": bytes, "<custom>": n}``.
    ``return_trajectories``: send whole records back to the driver (default: light ones; the
    store has the trajectories)."""

    def __init__(
        self,
        address: str | None = None,
        num_workers: int | None = None,
        resources_per_worker: dict[str, float] | None = None,
        *,
        workers_per_node: int | None = None,
        max_requeues: int = 2,
        max_worker_restarts: int = 3,
        restart_timeout_s: float = 120.0,
        start_timeout_s: float = 600.0,
        return_trajectories: bool = False,
        runtime_env: dict[str, Any] | None = None,
        init_options: dict[str, Any] | None = None,
    ) -> None:
        if num_workers is not None and num_workers < 1:
            raise ConfigError("num_workers must be at least 1")
        if workers_per_node is not None and (workers_per_node < 1 or num_workers is not None):
            raise ConfigError(
                "workers_per_node must be at least 1, and goes without num_workers (the count "
                "is the live nodes times workers_per_node)"
            )
        self.workers_per_node = workers_per_node
        self.address = address
        self.num_workers = num_workers
        self.resources_per_worker = dict(resources_per_worker or {"CPU": 1})
        self.max_requeues = max_requeues
        self.max_worker_restarts = max_worker_restarts
        self.restart_timeout_s = restart_timeout_s
        self.start_timeout_s = start_timeout_s
        self.return_trajectories = return_trajectories
        self.light_records = not return_trajectories
        self.runtime_env = runtime_env
        self.init_options = init_options or {}
        self.model_name = ""
        #: What each worker said when it started (pid, model), by worker index.
        self.worker_info: list[dict[str, Any]] = []
        #: Rollouts dispatched again because their worker was lost: infrastructure reruns,
        #: never charged to the policy (each rerun's record counts it in ``attempts``).
        self.redispatched = 0
        #: Live or restarting workers; ``_all_workers`` keeps the ones gone for good too.
        self._workers: list[RayWorker] = []
        self._all_workers: list[RayWorker] = []
        self._changed = asyncio.Condition()
        self._probes: set[asyncio.Task[None]] = set()
        self._store: Store | None = None
        self._owns_ray = False
        self._ray: Any = None
        self._engine = EngineChoice()
        #: The last weight update, replayed on a worker Ray restarts (it starts from the
        #: weights its engine loads at start).
        self._last_update: tuple[Any, int] | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, setup: WorkerConfig, loop: LoopThread, events: EventBus) -> None:
        # ``events`` stays here: each worker's rollouts are heard on the worker's own bus.
        if self._all_workers:
            raise ConfigError("a RayExecutor serves one client: make one per client")
        ray = self._ray = import_ray()
        check_shippable(setup, ray)
        if not ray.is_initialized():
            # None is a local cluster of its own: Ray's own None joins any cluster it finds
            # on this machine (another run's, a test's), unless RAY_ADDRESS names one.
            address = self.address or os.environ.get("RAY_ADDRESS") or "local"
            join_cluster(ray, address, self.address, self.init_options)
            self._owns_ray = True
        self._store = setup.store
        self._engine = setup.engine
        nodes = self._placement(ray)
        count = len(nodes)
        actor_class = ray.remote(RolloutWorker)
        # By value, not ray.put: a restarted actor needs its arguments again.
        self._workers = []
        for i, node in enumerate(nodes):
            actor = self._start_actor(actor_class, node, setup)
            calls = ChunkedCalls(actor, ray.exceptions)
            self._workers.append(RayWorker(i, actor, node=node, calls=calls))
        self._all_workers = list(self._workers)
        try:
            self.worker_info = ray.get(
                [w.actor.ready.remote() for w in self._workers], timeout=self.start_timeout_s
            )
        except Exception as exc:
            self._kill_actors()
            if self._owns_ray:
                ray.shutdown()
            cause = ray_cause(exc)
            if cause.startswith("ModuleNotFoundError"):
                cause += (
                    " (workers import agents and reward functions by module name: install the"
                    " module there, ship it with runtime_env={'py_modules': [...]}, or name the"
                    " agent by file path, which travels by value)"
                )
            raise ConfigError(f"Ray workers failed to start: {cause}") from exc
        self.model_name = self.worker_info[0]["model"]
        log.info("%d Ray workers ready", count, extra={"stage": "start_workers"})

    def close(self, loop: LoopThread) -> None:
        if self._ray is None:
            return
        if self._engine.shared is not None:  # the driver's own calls (weights, policy)
            loop.call(self._engine.shared.close())
        ray, self._ray = self._ray, None
        for probe in list(self._probes):
            loop.loop.call_soon_threadsafe(probe.cancel)
        closing = [w.actor.close.remote() for w in self._workers]
        if closing:
            ray.wait(closing, num_returns=len(closing), timeout=30)
        self._kill_actors(ray)
        if self._owns_ray:
            ray.shutdown()

    def load(self) -> list[dict[str, Any]]:
        """Per worker: whether it is up, rollouts in flight, rollouts dispatched to it, the
        Ray calls that carried them (rollouts dispatched together share one), and the node it
        is pinned to (None: spread by Ray)."""
        return [
            {
                "worker": w.index,
                "up": w.up,
                "in_flight": w.in_flight,
                "dispatched": w.dispatched,
                "ray_calls": w.calls.sent,
                "node": w.node,
            }
            for w in self._all_workers
        ]

    def describe(self) -> dict[str, Any]:
        return {
            "executor": "ray",
            "workers": len(self._all_workers),
            "workers_per_node": self.workers_per_node,
            "resources_per_worker": self.resources_per_worker,
        }

    # -- weights -----------------------------------------------------------------------------

    async def update_weights(self, new: NewWeights) -> WeightUpdate:
        """A shared ``RemoteGateway`` takes the update once; workers that each own an engine
        (``embedded``, ``sim``) all take it, the source shipped once through Ray's object
        store. Workers sharing remote servers through their own engines would update those
        servers once per worker: serve one ``rollway gateway`` and share it instead."""
        if self._engine.shared is not None:
            return await self._engine.shared.update_weights(new)
        if not self._engine.engine_per_worker:
            raise ConfigError(
                "with Ray, update weights through a shared gateway: engine "
                f"{self._engine.describe()} is shared by every worker (serve "
                "`rollway gateway --engine ...` and pass RemoteGateway)",
                "engine",
            )
        version = new.version
        if version is None:
            version = ((await self.policy()).version or 0) + 1
        # Put whole, passed as a top-level argument: each worker gets the NewWeights itself.
        ref = self._ray.put(dataclasses.replace(new, version=version))
        answers = await self._on_workers(lambda w: w.actor.update_weights.remote(ref))
        self._last_update = (ref, version)
        update: WeightUpdate = answers[0]  # each worker's is the same
        return update

    async def policy(self) -> PolicyState:
        if self._engine.shared is not None:
            return await self._engine.shared.policy()
        policy: PolicyState = (await self._on_workers(lambda w: w.actor.policy.remote()))[0]
        return policy

    async def _on_workers(self, call: Any) -> list[Any]:
        """``call`` on every live worker at once; a worker's failure fails the whole call."""
        alive = [w for w in self._workers if w.up]
        if not alive:
            raise InfrastructureError("no Ray worker is alive")
        refs = [asyncio.wrap_future(call(w).future()) for w in alive]
        try:
            return list(await asyncio.gather(*refs))
        except self._ray.exceptions.RayTaskError as exc:
            raise task_error(exc) from exc

    # -- running -----------------------------------------------------------------------------

    async def run(
        self, spec: RolloutSpec, settings: RolloutConfig, cancel: asyncio.Event
    ) -> RolloutRecord:
        started_at, clock = time.time(), time.monotonic()
        try:
            try:  # the first dispatch outside the retry loop: no loop per rollout in flight
                return await self._dispatch(spec, settings, cancel)
            except _WorkerLost as lost:
                settled = await self._after_loss(spec, settings, cancel, started_at, clock)
                if settled is not None:
                    return settled
                return await self._redispatch(spec, settings, cancel, lost, started_at, clock)
        except InfrastructureError as exc:  # no worker alive, or the worker raised
            return await self._record(spec, settings, "error", str(exc), started_at, clock)

    async def _redispatch(
        self,
        spec: RolloutSpec,
        settings: RolloutConfig,
        cancel: asyncio.Event,
        lost: _WorkerLost,
        started_at: float,
        clock: float,
    ) -> RolloutRecord:
        """A rollout whose worker was lost, dispatched again (each time under a new attempt
        id), at most ``max_requeues`` times; past that an infrastructure error."""
        losses = [lost.reason]
        redispatch = dataclasses.replace(
            WORKER_REDISPATCH, attempts=self.max_requeues, retry_on=(_WorkerLost,)
        )
        try:
            if self.max_requeues < 1:
                raise lost
            async for attempt in redispatch.retrying():
                with attempt:
                    spec = dataclasses.replace(spec, first_attempt=spec.first_attempt + 1)
                    self.redispatched += 1
                    try:
                        return await self._dispatch(spec, settings, cancel)
                    except _WorkerLost as again:
                        losses.append(again.reason)
                        settled = await self._after_loss(spec, settings, cancel, started_at, clock)
                        if settled is not None:
                            return settled
                        raise
        except _WorkerLost:
            reason = f"its Ray worker died {len(losses)} times (last: {losses[-1]})"
            return await self._record(spec, settings, "error", reason, started_at, clock)
        raise AssertionError("unreachable")

    async def _after_loss(
        self,
        spec: RolloutSpec,
        settings: RolloutConfig,
        cancel: asyncio.Event,
        started_at: float,
        clock: float,
    ) -> RolloutRecord | None:
        """The outcome of a rollout whose worker died, when there is one without running it
        again: the record the worker stored before it died, or cancelled."""
        stored = await asyncio.to_thread(self._store_or_fail().get, spec.rollout_key)
        if stored is not None and stored.run_id is not None and stored.run_id == spec.run_id:
            return stored if self.return_trajectories else stored.light()
        if cancel.is_set():
            reason = "cancelled while its Ray worker was lost"
            return await self._record(spec, settings, "cancelled", reason, started_at, clock)
        return None

    async def _dispatch(
        self, spec: RolloutSpec, settings: RolloutConfig, cancel: asyncio.Event
    ) -> RolloutRecord:
        """Run ``spec`` on the least-loaded live worker; ``_WorkerLost`` if it dies."""
        worker = await self._pick()
        worker.in_flight += 1
        try:
            return await self._run_on(worker, spec, settings, cancel)
        except CallLost as exc:
            self._lost(worker)
            log_stage(
                log,
                "worker_lost",
                attempt_id(settings, spec, spec.first_attempt),
                level=logging.WARNING,
                worker=worker.index,
                error=exc.reason,
            )
            raise _WorkerLost(exc.reason) from None
        finally:
            worker.in_flight -= 1

    async def _run_on(
        self, worker: RayWorker, spec: RolloutSpec, settings: RolloutConfig, cancel: asyncio.Event
    ) -> RolloutRecord:
        worker.dispatched += 1
        token, result = worker.calls.start(spec, settings)
        stop = asyncio.ensure_future(cancel.wait())

        def stop_on_worker(_: object) -> None:
            if not result.done():  # cancelled: the worker ends it and records "cancelled"
                worker.actor.cancel.remote(token)

        stop.add_done_callback(stop_on_worker)
        try:
            record: RolloutRecord = await result
        finally:
            stop.remove_done_callback(stop_on_worker)
            stop.cancel()
        if self.return_trajectories:
            return record
        return record.model_copy(update={"task": spec.task})  # the caller's own task object

    async def _pick(self) -> RayWorker:
        """The live worker with the fewest rollouts in flight; waits while all are restarting."""
        async with self._changed:
            while True:
                alive = [w for w in self._workers if w.up]
                if alive:
                    return min(alive, key=lambda w: (w.in_flight, w.dispatched))
                if not self._workers:
                    raise InfrastructureError("no Ray worker is alive")
                await self._changed.wait()

    def _lost(self, worker: RayWorker) -> None:
        if not worker.up:
            return
        worker.up = False
        probe = asyncio.ensure_future(self._probe(worker))
        self._probes.add(probe)
        probe.add_done_callback(self._probes.discard)

    async def _probe(self, worker: RayWorker) -> None:
        """Wait for Ray to restart a lost worker; drop it when it is gone for good."""
        if await wait_for_restart(worker, self._ray.exceptions, self.restart_timeout_s):
            worker.up = await catch_up(worker, self._last_update)
        async with self._changed:
            if not worker.up:
                self._workers.remove(worker)
                log.error("Ray worker %d is gone", worker.index, extra={"stage": "worker_gone"})
            self._changed.notify_all()

    async def _record(
        self,
        spec: RolloutSpec,
        settings: RolloutConfig,
        status: Literal["error", "cancelled"],
        reason: str,
        started_at: float,
        clock: float,
    ) -> RolloutRecord:
        """The driver's own record of a rollout no worker finished: an infrastructure error
        (resume runs it again) or, when the caller cancelled it meanwhile, cancelled."""
        kind: ErrorKind | None = "infrastructure" if status == "error" else None
        record = make_record(
            spec,
            settings,
            status,
            kind,
            reason,
            attempts=spec.first_attempt,
            started_at=started_at,
            elapsed_s=time.monotonic() - clock,
        )
        await asyncio.to_thread(self._store_or_fail().write, record)
        return record

    # -- internals ---------------------------------------------------------------------------

    def _store_or_fail(self) -> Store:
        if self._store is None:
            raise RuntimeError("the executor has not started")
        return self._store

    def _actor_options(self) -> dict[str, Any]:
        resources = dict(self.resources_per_worker)
        options: dict[str, Any] = {
            "num_cpus": resources.pop("CPU", 1),
            "num_gpus": resources.pop("GPU", 0),
            "max_restarts": self.max_worker_restarts,
            "max_task_retries": 0,  # the driver re-dispatches, to the least-loaded worker
            "max_concurrency": 100_000,  # rollouts are coroutines; the client caps them
            "scheduling_strategy": "SPREAD",
        }
        if "memory" in resources:
            options["memory"] = resources.pop("memory")
        if resources:
            options["resources"] = resources
        if self.runtime_env:
            options["runtime_env"] = self.runtime_env
        return options

    def _placement(self, ray: Any) -> list[str | None]:
        """Each worker's node: pinned per node (``workers_per_node``), else None (spread)."""
        if self.workers_per_node is None:
            return [None] * (self.num_workers or self._default_workers(ray))
        resources = {"CPU": 1.0, **self.resources_per_worker}
        nodes: list[str | None] = list(worker_nodes(ray, resources, self.workers_per_node))
        if not nodes:
            raise ConfigError(
                f"workers_per_node: no live Ray node has room for a worker of {resources}"
            )
        return nodes

    def _start_actor(self, actor_class: Any, node: str | None, setup: WorkerConfig) -> Any:
        options = self._actor_options()
        if node is not None:
            options["scheduling_strategy"] = pinned_to(self._ray, node)
        return actor_class.options(**options).remote(setup, self.return_trajectories)

    def _default_workers(self, ray: Any) -> int:
        cpus = float(ray.cluster_resources().get("CPU", 1))
        per_worker = float(self.resources_per_worker.get("CPU", 1)) or 1.0
        return max(1, int(cpus // per_worker))

    def _kill_actors(self, ray: Any = None) -> None:
        ray = ray or self._ray
        for worker in self._all_workers:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(worker.actor)
        self._workers = []
