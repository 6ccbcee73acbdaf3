"""A handle on one submitted rollout: await it, poll it, wait on it, cancel it, time it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Generator
from typing import Any

from rollway.types import RolloutRecord


class RolloutFuture:
    """Resolves to the rollout's ``RolloutRecord`` whatever the outcome; ``cancel()`` ends the
    rollout early and its record says ``cancelled``."""

    def __init__(
        self, future: concurrent.futures.Future[RolloutRecord], cancel_event: asyncio.Event,
        loop: asyncio.AbstractEventLoop,
    ) -> None:  # fmt: skip
        self._future = future
        self._cancel_event = cancel_event
        self._loop = loop
        self._started = time.monotonic()
        self._finished: float | None = None
        future.add_done_callback(self._mark_finished)

    def _mark_finished(self, _: Any) -> None:
        self._finished = time.monotonic()

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None) -> RolloutRecord:
        """Block until the outcome is recorded (``TimeoutError`` past ``timeout``)."""
        return self._future.result(timeout)

    def cancel(self) -> bool:
        """Ask the rollout to stop; False when it had already finished."""
        if self._future.done():
            return False
        self._loop.call_soon_threadsafe(self._cancel_event.set)
        return True

    @property
    def cancelled(self) -> bool:
        return self._future.done() and self._future.result().status == "cancelled"

    def elapsed(self) -> float:
        """Seconds since submission, until the outcome was recorded."""
        return (self._finished or time.monotonic()) - self._started

    def __await__(self) -> Generator[Any, None, RolloutRecord]:
        return asyncio.wrap_future(self._future).__await__()
