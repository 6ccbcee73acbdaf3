"""The client's view of the policy its rollouts sample from: which version is latest, starts held
while new weights load, and rollouts restarted when they fall too far behind.

Staleness is counted in versions: a rollout started under version ``v`` is ``latest - v`` behind.
With ``max_staleness=k`` an update that leaves a running rollout more than ``k`` behind cancels
that attempt and starts the rollout again under the new weights (a new attempt, not a failure),
so every token of every recorded rollout is at most ``k`` versions old when the batch ends.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from rollway.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(eq=False)
class RunningAttempt:
    """One attempt of a rollout in flight: the version it started under, and its own cancel
    (set by the caller's cancel or by staleness)."""

    version: int | None
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    stale: bool = False


class PolicyTracker:
    def __init__(self, max_staleness: int | None = None) -> None:
        if max_staleness is not None and (isinstance(max_staleness, bool) or max_staleness < 0):
            raise ConfigError(
                "max_staleness must be a whole number >= 0 (or None)", "max_staleness"
            )
        self.max_staleness = max_staleness
        #: The latest version (None: the engine has no versions).
        self.version: int | None = None
        #: Rollout attempts cancelled and started again for being too stale.
        self.restarts = 0
        self._open = asyncio.Event()
        self._open.set()
        self._running: set[RunningAttempt] = set()

    async def wait_open(self) -> None:
        """Return once no update is loading (starts wait for the new weights)."""
        await self._open.wait()

    def hold_starts(self) -> None:
        self._open.clear()

    def open_starts(self) -> None:
        self._open.set()

    def start(self, cancel: asyncio.Event) -> tuple[RunningAttempt, asyncio.Task[None] | None]:
        """Track an attempt starting now; the task relays the caller's ``cancel`` to it. With
        no staleness bound nothing else cancels it: it takes ``cancel`` itself, untracked (no
        task per rollout in flight)."""
        if self.max_staleness is None:
            return RunningAttempt(self.version, cancel), None
        attempt = RunningAttempt(self.version)
        self._running.add(attempt)

        async def relay() -> None:
            await cancel.wait()
            attempt.cancel.set()

        return attempt, asyncio.ensure_future(relay())

    def finish(self, attempt: RunningAttempt, relay: asyncio.Task[None] | None) -> None:
        if relay is not None:
            relay.cancel()
        self._running.discard(attempt)

    def advance(self, version: int | None) -> int:
        """A new latest version: cancel the attempts it leaves more than ``max_staleness``
        behind (their rollouts start again). How many were cancelled."""
        self.version = version
        if version is None or self.max_staleness is None:
            return 0
        stale = [
            a
            for a in self._running
            if a.version is not None and not a.stale and version - a.version > self.max_staleness
        ]
        for attempt in stale:
            attempt.stale = True
            attempt.cancel.set()
        self.restarts += len(stale)
        if stale:
            log.info(
                "%d rollouts restart under version %d (max_staleness %d)",
                len(stale),
                version,
                self.max_staleness,
                extra={"stage": "staleness"},
            )
        return len(stale)
