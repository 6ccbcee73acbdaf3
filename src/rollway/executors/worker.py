"""The body of a Ray worker actor: a ``LocalExecutor`` running many rollouts at once on the
actor's own event loop. Plain Python (no Ray import at module level); ``RayExecutor`` wraps it
with ``ray.remote``."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Hashable
from typing import Any

from rollway import tracing
from rollway.events import EventBus
from rollway.executors.base import WorkerConfig
from rollway.executors.local_executor import LocalExecutor
from rollway.gateway.weight_control import NewWeights, PolicyState, WeightUpdate
from rollway.results import RolloutRecord
from rollway.rollouts import RolloutConfig, RolloutSpec

#: Hosts that mean "every interface": a worker bound there hands out its node's address.
_ANY_HOST = ("0.0.0.0", "::")


class RolloutWorker:
    def __init__(self, setup: WorkerConfig, full_records: bool = False) -> None:
        tracing.enable_if(setup.trace)  # exported as this node's OTEL_* variables say
        self._executor = LocalExecutor()
        # An embedded engine loads here, once per worker; its events stay in the worker.
        self._executor.prepare(setup, EventBus())
        self._setup = setup
        self._full_records = full_records
        self._serving: asyncio.Future[None] | None = None
        self._cancels: dict[Hashable, asyncio.Event] = {}
        self._cancelled_early: set[Hashable] = set()

    async def ready(self) -> dict[str, Any]:
        """Start serving (once) and say who this worker is: its process, model and node."""
        import ray

        await self._served()
        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        return {"pid": os.getpid(), "model": self._executor.model_name, "node": node}

    async def _served(self) -> None:
        if self._serving is None:
            advertise = None
            if self._setup.serving.host in _ANY_HOST:
                import ray

                advertise = ray.util.get_node_ip_address()
            self._serving = asyncio.ensure_future(self._executor.serve(advertise))
        await asyncio.shield(self._serving)

    async def run_chunk(
        self, chunk: list[tuple[int, RolloutSpec, RolloutConfig]]
    ) -> AsyncIterator[list[tuple[int, RolloutRecord | str]]]:
        """Several rollouts in one Ray call (the driver's per-call cost shared by all), run at
        once; streamed back as they finish, each ``(token, record)``, or ``(token, error)``
        when running it raised (a bug, not the rollout's outcome). Whatever finished since the
        last yield goes in one."""
        finished: asyncio.Queue[tuple[int, RolloutRecord | str]] = asyncio.Queue()
        running = [
            asyncio.ensure_future(self._run_into(finished, token, spec, settings))
            for token, spec, settings in chunk
        ]
        left = len(running)
        while left:
            out = [await finished.get()]
            while not finished.empty():
                out.append(finished.get_nowait())
            left -= len(out)
            yield out
        await asyncio.gather(*running)

    async def _run_into(
        self,
        finished: asyncio.Queue[tuple[int, RolloutRecord | str]],
        token: int,
        spec: RolloutSpec,
        settings: RolloutConfig,
    ) -> None:
        try:
            outcome: RolloutRecord | str = await self.run(token, spec, settings)
        except Exception as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        finished.put_nowait((token, outcome))

    async def run(
        self, token: Hashable, spec: RolloutSpec, settings: RolloutConfig
    ) -> RolloutRecord:
        """One rollout to its record (in the store); the driver gets it light by default."""
        cancel = self._cancels[token] = asyncio.Event()
        if token in self._cancelled_early:
            self._cancelled_early.discard(token)
            cancel.set()
        try:
            await self._served()
            record = await self._executor.run(spec, settings, cancel)
        finally:
            self._cancels.pop(token, None)
        if self._full_records:
            return record
        # Light: no trajectory (it is in the store) and no task (the driver has it).
        return record.light().model_copy(update={"task": {}})

    async def cancel(self, token: Hashable) -> None:
        event = self._cancels.get(token)
        if event is not None:
            event.set()
        elif len(self._cancelled_early) < 100_000:  # the cancel overtook its run
            self._cancelled_early.add(token)

    async def update_weights(self, new: NewWeights) -> WeightUpdate:
        """Load new weights into this worker's own engine (the driver sends the same update
        to every worker, through Ray's object store)."""
        return await self._executor.update_weights(new)

    async def policy(self) -> PolicyState:
        return await self._executor.policy()

    async def close(self) -> None:
        await self._executor.aclose()
