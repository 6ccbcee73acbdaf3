"""What happens to rollouts, as it happens: small frozen events, and the ``EventBus`` that
carries them from where they occur (the runner, the gateway) to whoever listens (the client's
``events()`` and ``on_event``).

An emitter checks ``if bus:`` before it builds an event: with nobody listening that is the whole
cost. Every event has a ``kind``, a wall-clock time ``at`` and the ``rollout_id`` of the attempt
it is about (the gateway's id, ``exp.task.sample.attempt``); ``to_dict`` is JSON-ready.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from rollway.results import RolloutRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutEvent:
    kind: ClassVar[str] = "event"
    rollout_id: str
    at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **dataclasses.asdict(self)}


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutStarted(RolloutEvent):
    """An attempt starts (a retry is a new attempt, with its own ``rollout_id``)."""

    kind: ClassVar[str] = "rollout_started"
    task_key: str
    group: str
    attempt: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnStarted(RolloutEvent):
    """A chat call reached the gateway and goes to the engine; ``turn`` counts from 0."""

    kind: ClassVar[str] = "turn_started"
    turn: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnFinished(RolloutEvent):
    """The gateway answered the call (``finish_reason`` ``error``: it failed)."""

    kind: ClassVar[str] = "turn_finished"
    turn: int
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    finish_reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCalled(RolloutEvent):
    """An in-process agent ran a tool (``execute_tool_calls``, ``ctx.record_tool_call``)."""

    kind: ClassVar[str] = "tool_call"
    name: str
    latency_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RewardScored(RolloutEvent):
    kind: ClassVar[str] = "reward"
    reward: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutFinished(RolloutEvent):
    """The rollout's one outcome, as its record says (``rollout_id``: its last attempt);
    ``reward_components``: its reward's components (``RolloutRecord.reward_components``)."""

    kind: ClassVar[str] = "rollout_finished"
    status: str
    reason: str | None
    reward: float | None
    elapsed_s: float
    reward_components: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutStuck(RolloutEvent):
    """No progress for ``idle_s`` seconds. ``waiting_in``: ``agent`` (no model call pending)
    or ``engine`` (the call ``request_id`` has been pending for ``idle_s``)."""

    kind: ClassVar[str] = "rollout_stuck"
    waiting_in: str
    request_id: str | None
    idle_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class EventsDropped(RolloutEvent):
    """A listener fell behind: ``dropped`` events were left out before this one."""

    kind: ClassVar[str] = "dropped"
    rollout_id: str = ""
    dropped: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StepHandedOver(RolloutEvent):
    """A step source handed a trainer its batch (``client.step_source``): ``metrics`` is the
    step's ``StepMetrics.to_dict()``."""

    kind: ClassVar[str] = "step"
    rollout_id: str = ""
    step: int
    metrics: dict[str, Any]


def outcome_events(record: RolloutRecord) -> list[RolloutEvent]:
    """A finished rollout's last events, from its record: its reward (when it has one), then
    the outcome."""
    scored: list[RolloutEvent] = []
    if record.reward is not None:
        scored.append(RewardScored(rollout_id=record.rollout_id, reward=record.reward))
    finished = RolloutFinished(
        rollout_id=record.rollout_id,
        status=record.status,
        reason=record.reason,
        reward=record.reward,
        elapsed_s=record.elapsed_s,
        reward_components=record.reward_components,
    )
    return [*scored, finished]


EventSink = Callable[[RolloutEvent], None]


class EventBus:
    """Fans events out to its sinks (callables, or other buses). False while nobody listens.
    A sink that raises is logged and skipped: listening never breaks a rollout. Pickled (to a
    Ray worker) it arrives empty: listeners stay in their own process."""

    def __init__(self) -> None:
        # Replaced whole, never mutated: emitting on one thread while another subscribes.
        self._sinks: tuple[EventSink, ...] = ()

    def __bool__(self) -> bool:
        return any(self._sinks)

    def __reduce__(self) -> tuple[type[EventBus], tuple[()]]:
        return EventBus, ()

    def subscribe(self, sink: EventSink) -> None:
        self._sinks = (*self._sinks, sink)

    def unsubscribe(self, sink: EventSink) -> None:
        self._sinks = tuple(s for s in self._sinks if s != sink)  # bound methods: equal, not same

    def __call__(self, event: RolloutEvent) -> None:
        for sink in self._sinks:
            try:
                sink(event)
            except Exception:
                log.exception("an event listener failed on %s", event.kind)


__all__ = [
    "EventBus",
    "EventSink",
    "EventsDropped",
    "RewardScored",
    "RolloutEvent",
    "RolloutFinished",
    "RolloutStarted",
    "RolloutStuck",
    "StepHandedOver",
    "ToolCalled",
    "TurnFinished",
    "TurnStarted",
]
