"""Outages: the components a rollout depends on (a shared gateway, the engine behind an
in-process gateway, an agent server), whether each is down and since when, and the waits of the
rollouts that need it back.

A component is found down by probing its health after an attempt failed for a reason that says
nothing about the policy (an infrastructure or engine error), and is then polled with backoff
until it answers again. Meanwhile no attempt starts (queued rollouts included), an attempt lost
to the outage does not count as a try, and each rollout waits at most its own timeout in all
before it is recorded as an error naming what was down. A component that goes down and comes
back while an attempt runs has cost that attempt too: ``epoch`` counts outages, so the attempt
sees one happened since it started."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from rollway.errors import ErrorKind
from rollway.results import RolloutRecord
from rollway.retry import Backoff, is_transient

log = logging.getLogger(__name__)

#: How often a component that is down is asked whether it is back (loopback health calls are
#: cheap; a vLLM restart takes minutes, a gateway's seconds).
HEALTH_POLL = Backoff(first_s=0.2, factor=2.0, max_s=2.0)
#: A probe that has not answered in this long says the component is down (a hung server).
PROBE_TIMEOUT_S = 10.0
#: Attempts one rollout may lose to outages without counting them: past this, a component that
#: goes down whenever this rollout runs (a request that crashes it) spends its tries as usual.
FREE_RETRIES = 8


@dataclass(frozen=True)
class Component:
    """Something rollouts need up. ``kind`` is the error kind of a rollout it fails (an engine
    is ``engine``; a gateway or agent server ``infrastructure``); ``probe`` is its health
    check, true while it serves."""

    name: str
    kind: ErrorKind
    probe: Callable[[], Awaitable[bool]]


@dataclass
class _State:
    component: Component
    down_since: float | None = None
    back: asyncio.Event = field(default_factory=asyncio.Event)
    waiting: int = 0
    probing: asyncio.Task[bool] | None = None
    polling: asyncio.Task[None] | None = None


@dataclass(frozen=True)
class Outage:
    """A component still down when a rollout's wait ran out."""

    component: Component
    down_s: float
    waited_s: float

    def reason(self) -> str:
        return (
            f"{self.component.name} was down for {self.down_s:.0f} s; the rollout waited "
            f"{self.waited_s:.0f} s for it, as long as its timeout allows"
        )


class Availability:
    """The components of one executor, shared by its rollouts (on one event loop)."""

    def __init__(self, components: Sequence[Component] = (), poll: Backoff = HEALTH_POLL) -> None:
        self._states = [_State(c) for c in components]
        self._poll = poll
        self._closed = False
        #: Outages seen so far: an attempt that saw it change was hit by one.
        self.epoch = 0

    def down(self) -> list[Component]:
        return [s.component for s in self._states if s.down_since is not None]

    def status(self) -> list[str]:
        """One phrase per component down, for the status lines."""
        now = time.monotonic()
        return [
            f"waiting for {s.component.name} (down {now - s.down_since:.0f} s): "
            f"{s.waiting} rollouts"
            for s in self._states
            if s.down_since is not None
        ]

    async def check(self) -> bool:
        """Probe every component not known to be down (one probe at a time each, shared by
        every caller); True when any is down now."""
        up = [s for s in self._states if s.down_since is None]
        await asyncio.gather(*(self._probe_once(s) for s in up))
        return any(s.down_since is not None for s in self._states)

    async def is_down(self, component: Component) -> bool:
        """Whether ``component`` is down, probing it unless it is known to be (one probe at a
        time, shared): a rollout that lost touch with it mid-attempt asks, and the outage is
        marked once, for every rollout, with its status line."""
        state = next(s for s in self._states if s.component == component)
        if state.down_since is None:
            await self._probe_once(state)
        return state.down_since is not None

    async def wait_up(self, within_s: float | None, cancel: asyncio.Event) -> Outage | None:
        """Wait until no component is down, ``cancel`` is set, or ``within_s`` seconds have
        passed (None: no bound); the outage still on in the last case."""
        started = time.monotonic()
        for state in self._states:
            if state.down_since is None:
                continue
            left = None if within_s is None else max(0.0, within_s - (time.monotonic() - started))
            state.waiting += 1
            try:
                back = await _first(state.back.wait(), cancel, left)
            finally:
                state.waiting -= 1
            if cancel.is_set():
                return None
            if not back and state.down_since is not None:
                now = time.monotonic()
                return Outage(state.component, now - state.down_since, now - started)
        return None

    async def aclose(self) -> None:
        self._closed = True  # a poll whose cancel was swallowed still stops at its next turn
        tasks = [t for s in self._states for t in (s.probing, s.polling) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _probe_once(self, state: _State) -> None:
        if state.probing is None:
            state.probing = asyncio.ensure_future(_healthy(state.component))
            state.probing.add_done_callback(lambda _: setattr(state, "probing", None))
        task = state.probing
        if not await asyncio.shield(task) and state.down_since is None:
            self._mark_down(state)

    def _mark_down(self, state: _State) -> None:
        state.down_since = time.monotonic()
        state.back.clear()
        self.epoch += 1
        log.warning("%s is down: rollouts wait for it", state.component.name)
        state.polling = asyncio.ensure_future(self._poll_until_back(state))

    async def _poll_until_back(self, state: _State) -> None:
        for delay in self._poll.delays_s():
            await asyncio.sleep(delay)
            if self._closed:
                return
            if await _healthy(state.component):
                break
        assert state.down_since is not None
        log.warning(
            "%s is back after %.0f s", state.component.name, time.monotonic() - state.down_since
        )
        state.down_since, state.polling = None, None
        state.back.set()


class OutageWaits:
    """One rollout's side of outages: its waits, bounded in all by its timeout (None: no
    bound), and the attempts it lost to them."""

    def __init__(self, availability: Availability, timeout_s: float | None) -> None:
        self.availability = availability
        self._left_s = timeout_s
        self._free = FREE_RETRIES
        #: Set once a wait ran out: the rollout ends with that record, no retry.
        self.ended = False

    async def wait(self, cancel: asyncio.Event) -> Outage | None:
        """Before an attempt: wait for what is down; the outage if it outlasted the budget."""
        started = time.monotonic()
        outage = await self.availability.wait_up(self._left_s, cancel)
        if self._left_s is not None:
            self._left_s = max(0.0, self._left_s - (time.monotonic() - started))
        self.ended = outage is not None
        return outage

    async def lost(self, record: RolloutRecord, epoch: int, cancel: asyncio.Event) -> bool:
        """Whether the attempt that gave ``record`` (started at ``epoch``) was lost to an
        outage, and is free to go again without counting as a try. A timeout counts too: an
        agent server that died mid-rollout is noticed by its status calls only after minutes,
        so its rollouts run out of time first, through no fault of the policy."""
        if cancel.is_set() or self._free <= 0:
            return False
        if not (is_transient(record) or record.status == "timeout"):
            return False
        await self.availability.check()
        if self.availability.epoch == epoch:
            return False
        self._free -= 1
        return True


async def _healthy(component: Component) -> bool:
    try:
        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that arrives as
        # the probe ends, and a poll of a component gone for good then never stops.
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            return bool(await component.probe())
    except Exception as exc:
        log.debug("%s health probe failed: %r", component.name, exc)
        return False


async def _first(waited: Awaitable[object], cancel: asyncio.Event, within_s: float | None) -> bool:
    """Await ``waited`` unless ``cancel`` is set or ``within_s`` passes first; True if it
    finished."""
    task = asyncio.ensure_future(waited)
    stop = asyncio.ensure_future(cancel.wait())
    try:
        await asyncio.wait({task, stop}, timeout=within_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        task.cancel()  # nothing, once it has finished
        await asyncio.gather(task, stop, return_exceptions=True)
    return not task.cancelled()
