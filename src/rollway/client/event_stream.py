"""A client's event stream: listeners with bounded queues (``RolloutClient.events()``),
callbacks (``on_event``), and a JSON-lines log of every event (``rollway run --events``).

Where events come from: in this process (the local executor) the runner says when each attempt
starts and the gateway when each turn starts and finishes; the client adds the reward and the
outcome from each final record. Rollouts on Ray workers give only what the driver sees: a start
(when the rollout is dispatched) and the reward and outcome from the record that comes back."""

from __future__ import annotations

import asyncio
import collections
import threading
from pathlib import Path
from types import TracebackType
from typing import IO

import orjson

from rollway.events import EventBus, EventsDropped, RolloutEvent, RolloutStarted, outcome_events
from rollway.results import RolloutRecord
from rollway.rollouts import RolloutConfig, RolloutSpec
from rollway.rollouts.spec import attempt_id

#: Events a listener may hold before it loses the oldest news: it drops the newest instead.
DEFAULT_QUEUE_SIZE = 10_000


class _Gap:
    """Where a listener's queue lost events: their count, read as one ``EventsDropped``."""

    __slots__ = ("dropped",)

    def __init__(self) -> None:
        self.dropped = 0


class EventListener:
    """An async iterator over the events since it subscribed. Events arrive on the client's
    thread and never wait for the listener: past ``max_queued`` unread ones, new events are
    dropped and counted, and an ``EventsDropped`` notice takes their place in the stream: after
    the events queued before them, before any queued after (so a reader knows where the gap
    is). Iteration ends once the client closes (or ``close()``), after what was queued."""

    def __init__(self, bus: EventBus, max_queued: int = DEFAULT_QUEUE_SIZE) -> None:
        self._bus, self._max = bus, max_queued
        # Events and gaps, in order; only events count against ``max_queued``.
        self._queue: collections.deque[RolloutEvent | _Gap] = collections.deque()
        self._events = 0
        self._lock = threading.Lock()
        self._closed = False
        # Bound to the reader's loop at its first read; until then a push only queues.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        bus.subscribe(self.push)

    def push(self, event: RolloutEvent) -> None:
        with self._lock:
            if self._closed:
                return
            if self._events >= self._max:
                gap = self._queue[-1] if self._queue else None
                if not isinstance(gap, _Gap):  # events came since the last gap: a new one
                    gap = _Gap()
                    self._queue.append(gap)
                gap.dropped += 1
            else:
                self._queue.append(event)
                self._events += 1
            first = len(self._queue) == 1
        if first:
            self._poke()

    def close(self) -> None:
        """Stop listening; what is queued can still be read."""
        self._bus.unsubscribe(self.push)
        with self._lock:
            self._closed = True
        self._poke()

    @property
    def queued(self) -> int:
        """Unread events (not counting what was dropped)."""
        return self._events

    def __aiter__(self) -> EventListener:
        return self

    async def __anext__(self) -> RolloutEvent:
        if self._wake is None:
            self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        while True:
            with self._lock:
                if self._queue:
                    item = self._queue.popleft()
                    if isinstance(item, _Gap):
                        return EventsDropped(dropped=item.dropped)
                    self._events -= 1
                    return item
                if self._closed:
                    raise StopAsyncIteration
                # Cleared under the lock: a push after this wakes the wait below.
                self._wake.clear()
            await self._wake.wait()

    def _poke(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            loop.call_soon_threadsafe(wake.set)

    async def __aenter__(self) -> EventListener:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class ClientEvents:
    """The client's bus, its listeners, and the events only the client can give."""

    def __init__(self) -> None:
        self.bus = EventBus()
        self._listeners: set[EventListener] = set()

    def listen(self, max_queued: int = DEFAULT_QUEUE_SIZE) -> EventListener:
        listener = EventListener(self.bus, max_queued)
        self._listeners.add(listener)
        return listener

    def started_elsewhere(self, spec: RolloutSpec, settings: RolloutConfig) -> None:
        """A rollout handed to an executor that runs it out of sight (a Ray worker)."""
        if self.bus:
            self.bus(
                RolloutStarted(
                    rollout_id=attempt_id(settings, spec, spec.first_attempt),
                    task_key=spec.rollout_key,
                    group=spec.group_id,
                    attempt=spec.first_attempt,
                )
            )

    def finished(self, record: RolloutRecord) -> None:
        if self.bus:
            for event in outcome_events(record):
                self.bus(event)

    def close(self) -> None:
        for listener in self._listeners:
            listener.close()


class JsonlEventLog:
    """Writes each event as one JSON line, flushed as it goes (a callback for ``on_event``)."""

    def __init__(self, path: str | Path) -> None:
        self._file: IO[bytes] = Path(path).open("wb")  # noqa: SIM115 (open until close())

    def __call__(self, event: RolloutEvent) -> None:
        self._file.write(orjson.dumps(event.to_dict()) + b"\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
