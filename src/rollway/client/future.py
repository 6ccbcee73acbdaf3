"""A handle on one submitted rollout: await it, poll it, wait on it, cancel it, time it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
import time
from collections.abc import Coroutine, Generator
from typing import Any

from rollway.errors import is_failure
from rollway.loop_thread import in_thread
from rollway.results import RolloutRecord
from rollway.rollouts import RolloutConfig, RolloutSpec
from rollway.rollouts.records import make_record
from rollway.store.base import Store


class CancelGate:
    """Where a caller's cancel and the settling of the rollout's outcome meet, one at a time
    under a lock, so that ``cancel()`` answers exactly: a cancel granted before the outcome is
    settled makes the record ``cancelled`` (even when the rollout was ending another way), and
    once it is settled a cancel is refused. ``event`` is the signal the executor watches."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.event = asyncio.Event()
        self._loop = loop
        self._lock = threading.Lock()
        self._granted = False
        self._settled = False

    def request(self) -> bool:
        """Ask the rollout to stop (from any thread); True when it will end ``cancelled``."""
        with self._lock:
            if self._settled:
                return False
            if not self._granted:
                self._granted = True
                self._loop.call_soon_threadsafe(self.event.set)
            return True

    async def settle(self, record: RolloutRecord, store: Store) -> RolloutRecord:
        """The outcome to keep: ``record``, unless a cancel was granted while the rollout was
        ending another way; then the record says cancelled, in ``store`` too."""
        with self._lock:
            self._settled = True
            overruled = self._granted and record.status != "cancelled"
        if not overruled:
            return record
        await in_thread(_store_cancelled, store, record)
        return _cancelled(record)


async def recorded(
    running: Coroutine[Any, Any, RolloutRecord],
    spec: RolloutSpec,
    settings: RolloutConfig,
    store: Store,
) -> RolloutRecord:
    """``running``'s record; a ``CancelledError`` that nothing cancelling raised (user code's
    own, wherever it slipped through) is that rollout's error, recorded in ``store``: let
    through, it would cancel the rollout's future and raise out of the whole batch."""
    started_at = time.time()
    try:
        return await running
    except asyncio.CancelledError as exc:
        if not is_failure(exc):  # the rollout itself is being cancelled
            raise
        reason = "the rollout raised asyncio.CancelledError though nothing cancelled it"
        record = make_record(
            spec,
            settings,
            "error",
            "agent",
            reason,
            attempts=spec.first_attempt,
            started_at=started_at,
            elapsed_s=time.time() - started_at,
        )
        await in_thread(store.write, record)
        return record


def _cancelled(record: RolloutRecord) -> RolloutRecord:
    """``record`` as a rollout cancelled while it ended: what it had done stays (trajectory,
    metrics), as in any cancelled record; no reward, as no cancelled record has one."""
    had = record.status + (f": {record.reason}" if record.reason else "")
    return record.model_copy(
        update={
            "status": "cancelled",
            "error_kind": None,
            "reason": f"cancelled by the caller as it ended ({had})",
            "reward": None,
            "reward_info": {},
        }
    )


def _store_cancelled(store: Store, record: RolloutRecord) -> None:
    # A light record (from a Ray worker) left its trajectory in the stored one: keep it there.
    stored = store.get(record.rollout_key) if record.trajectory_stats is not None else None
    store.write(_cancelled(stored or record))


class RolloutFuture:
    """Resolves to the rollout's ``RolloutRecord`` whatever the outcome; ``cancel()`` ends the
    rollout early and its record says ``cancelled``. Awaiting it (``await future`` or
    ``result_async()``) works from any event loop; cancelling the awaiting task cancels the
    rollout the same way (wrap it in ``asyncio.shield`` to let the rollout go on)."""

    def __init__(self, future: concurrent.futures.Future[RolloutRecord], gate: CancelGate) -> None:
        self._future = future
        self._gate = gate
        # [submitted, finished]: set by a callback that holds this list, not the handle. The
        # concurrent future keeps its callbacks once done, so a callback holding the handle
        # would make a cycle (handle -> future -> callback -> handle) of every finished
        # rollout, its record in it: freed only by a full collection, not when let go.
        self._times: list[float | None] = [time.monotonic(), None]
        future.add_done_callback(functools.partial(_mark_finished, self._times))

    def done(self) -> bool:
        """Whether the outcome is recorded."""
        return self._future.done()

    def result(self, timeout: float | None = None) -> RolloutRecord:
        """Block until the outcome is recorded (``TimeoutError`` past ``timeout``)."""
        return self._future.result(timeout)

    async def result_async(self) -> RolloutRecord:
        """The record, awaited without blocking the running loop (any loop, not only the
        client's)."""
        # Shielded: a cancelled awaiter must not tear the rollout down mid-way (no record);
        # it asks for the rollout's own cancel instead, which records ``cancelled``.
        waiting = asyncio.wrap_future(self._future)
        try:
            return await asyncio.shield(waiting)
        except asyncio.CancelledError:
            self.cancel()
            raise

    def cancel(self) -> bool:
        """Ask the rollout to stop. True exactly when its record will say ``cancelled``; False
        when its outcome was already settled (finished, or being recorded)."""
        if self._future.done():
            return False
        return self._gate.request()

    @property
    def cancelled(self) -> bool:
        """Whether the recorded outcome is ``cancelled`` (False while running)."""
        if not self._future.done() or self._future.exception() is not None:
            return False
        return self._future.result().status == "cancelled"

    def elapsed(self) -> float:
        """Seconds since submission, until the outcome was recorded."""
        started, finished = self._times
        assert started is not None
        return (finished or time.monotonic()) - started

    def __await__(self) -> Generator[Any, None, RolloutRecord]:
        return self.result_async().__await__()


def _mark_finished(times: list[float | None], _: Any) -> None:
    times[1] = time.monotonic()
