"""When a submitted rollout may start: a slot under ``max_concurrent``, a start under
``tps_limit``, starts held while weights load, and a new attempt when an update leaves it
more than ``max_staleness`` versions behind. It lives in the client, ahead of every executor:
with Ray the cap and the rate hold across the whole cluster, not per worker."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Coroutine
from typing import Any

from aiolimiter import AsyncLimiter

from rollway.client.event_stream import ClientEvents
from rollway.client.policy_tracker import PolicyTracker
from rollway.executors import Executor, LocalExecutor
from rollway.results import RolloutRecord
from rollway.rollouts import RolloutConfig, RolloutSpec


class Admission:
    def __init__(
        self,
        executor: Executor,
        policy: PolicyTracker,
        events: ClientEvents,
        max_concurrent: int,
        tps_limit: float | None,
    ) -> None:
        self.executor = executor
        self.policy = policy
        self.events = events
        self._slots = asyncio.Semaphore(max_concurrent)
        # Capacity 1 spaces starts evenly (no burst): at most tps_limit in any second.
        self._starts = AsyncLimiter(1, 1.0 / tps_limit) if tps_limit is not None else None

    async def run(
        self, spec: RolloutSpec, settings: RolloutConfig, cancel: asyncio.Event
    ) -> RolloutRecord:
        """Run ``spec`` once it may start; its record whatever happens."""
        if not await _unless_cancelled(self._slots.acquire(), cancel):
            # Cancelled while queued: no slot needed, the executor records it and starts
            # nothing (no registration, no agent, no generation).
            return await self.executor.run(spec, settings, cancel)
        try:
            if self._starts is not None:
                await _unless_cancelled(self._starts.acquire(), cancel)
            return await self._run_fresh(spec, settings, cancel)
        finally:
            self._slots.release()

    async def _run_fresh(
        self, spec: RolloutSpec, settings: RolloutConfig, cancel: asyncio.Event
    ) -> RolloutRecord:
        """Run ``spec``, starting it again (a new attempt) whenever an update leaves it more
        than ``max_staleness`` versions behind; starts wait while weights load."""
        while True:
            await _unless_cancelled(self.policy.wait_open(), cancel)
            attempt, relay = self.policy.start(cancel)
            if not isinstance(self.executor, LocalExecutor):  # else the runner says it
                self.events.started_elsewhere(spec, settings)
            try:
                record = await self.executor.run(spec, settings, attempt.cancel)
            finally:
                self.policy.finish(attempt, relay)
            if not attempt.stale or cancel.is_set():
                return record
            spec = dataclasses.replace(spec, first_attempt=record.attempts + 1)


async def _unless_cancelled(acquire: Coroutine[Any, Any, Any], cancel: asyncio.Event) -> bool:
    """Await ``acquire`` (a slot, a start under the rate limit) unless ``cancel`` is set
    first; True when it was acquired, and the caller then owns what it took."""
    taken = asyncio.ensure_future(acquire)
    stop = asyncio.ensure_future(cancel.wait())
    try:
        await asyncio.wait({taken, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        taken.cancel()  # nothing, once it has acquired
    await asyncio.gather(taken, return_exceptions=True)
    return not taken.cancelled()
