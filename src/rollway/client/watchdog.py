"""The stuck-rollout watchdog: a rollout without progress for ``stuck_after_s`` seconds is
reported once (a WARNING and a ``RolloutStuck`` event) with where it waits (in its agent, at the
gateway, or on an engine request, named), and with ``abort_stuck`` stopped and recorded as a
``timeout`` saying so. It watches the gateway in the client's process; rollouts on Ray workers
or on a shared ``--gateway`` are not watched (their own time limit still holds)."""

from __future__ import annotations

import asyncio
import logging

from rollway.errors import ConfigError
from rollway.events import EventBus, RolloutStuck
from rollway.executors import Executor, LocalExecutor
from rollway.gateway.handle import LocalGateway

log = logging.getLogger(__name__)

#: Generous: a model call or a tool may well take minutes; none should take five silently.
DEFAULT_STUCK_AFTER_S = 300.0


class Watchdog:
    def __init__(
        self, executor: Executor, events: EventBus, after_s: float | None, abort: bool
    ) -> None:
        if after_s is not None and not after_s > 0:  # NaN too
            raise ConfigError("stuck_after_s must be a positive number of seconds (or None)")
        self.executor, self.events = executor, events
        self.after_s, self.abort = after_s, abort
        #: Rollouts stuck at the last look (the status lines show it).
        self.stuck = 0
        self._reported: set[tuple[str, str, str | None]] = set()

    async def watch_forever(self) -> None:
        """Look a few times per limit until cancelled (the client owns this task)."""
        if self.after_s is None:
            return
        interval = min(max(self.after_s / 4, 0.05), 5.0)
        while True:
            await asyncio.sleep(interval)
            self.check()

    def check(self) -> list[RolloutStuck]:
        """Report what is newly stuck (once per place it waits); all that is stuck back."""
        executor = self.executor
        if self.after_s is None or not isinstance(executor, LocalExecutor):
            return []
        gateway = executor.gateway
        if not isinstance(gateway, LocalGateway):
            return []
        found = gateway.gateway.stuck(self.after_s)
        self.stuck = len(found)
        seen = set()
        for event in found:
            key = (event.rollout_id, event.waiting_in, event.request_id)
            seen.add(key)
            if key in self._reported:
                continue
            reason = describe(event)
            log.warning(reason, extra={"rollout_id": event.rollout_id, "stage": "stuck"})
            if self.events:
                self.events(event)
            if self.abort:
                executor.abort(event.rollout_id, reason)
        self._reported = seen  # a rollout that moved on is reported again if it sticks again
        return found


def describe(event: RolloutStuck) -> str:
    where = {
        "engine": f"waiting on the engine (request {event.request_id})",
        "gateway": "queued at the gateway (its model call has not reached the engine)",
        "agent": "in its agent (no model call pending)",
    }[event.waiting_in]
    return f"stuck: no progress for {_seconds(event.idle_s)} s, {where}"


def _seconds(value: float) -> str:
    """Whole seconds, but tenths under ten: a limit of 0.5 s must not read as 1 s (nor 0)."""
    return f"{value:.1f}" if value < 10 else f"{value:.0f}"
