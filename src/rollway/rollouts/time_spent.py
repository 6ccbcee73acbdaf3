"""Where a rollout's time went when it ran out before any turn was recorded: its record's
reason says so, so ``timeout`` alone never leaves a user guessing between an overloaded
engine (lower the concurrency, raise the timeout) and a slow agent (its start-up, its tools)."""

from __future__ import annotations

from rollway.events import RolloutStuck
from rollway.gateway.handle import GatewayHandle, LocalGateway


def where_time_went(gateway: GatewayHandle, rollout_id: str) -> str | None:
    """Where the rollout waits now, in words; None where the gateway is not in this process
    (a shared one keeps its rollouts' state to itself)."""
    if not isinstance(gateway, LocalGateway):
        return None
    core = gateway.gateway
    waiting = core.waiting(rollout_id)
    if waiting is None:
        return None
    return describe(waiting, core.requests_in_flight())


def describe(waiting: RolloutStuck, in_flight: int) -> str:
    """``waiting`` in words; ``in_flight``: the engine requests of every rollout at the time."""
    idle = _seconds(waiting.idle_s)
    if waiting.waiting_in == "engine":
        return (
            f"its model call waited {idle} s for the engine, with {in_flight} model calls in "
            "flight (queued behind each other on a busy engine: lower max_concurrent or raise "
            "timeout)"
        )
    if waiting.waiting_in == "gateway":
        return (
            f"its model call waited {idle} s at the gateway without reaching the engine (held "
            "while the engine paused or loaded new weights)"
        )
    return (
        f"no model call was pending for the last {idle} s: the agent itself took the time "
        "(loading, starting up, its own code or tools)"
    )


def _seconds(value: float) -> str:
    """Whole seconds, but tenths under ten: a limit of 0.5 s must not read as 1 s (nor 0)."""
    return f"{value:.1f}" if value < 10 else f"{value:.0f}"
