"""A rollout attempt's trace span (``rollway.rollout``): what it says when it starts and ends."""

from __future__ import annotations

from typing import Any

from rollway import tracing
from rollway.results import RolloutRecord
from rollway.rollouts.spec import RolloutSpec


def span_attributes(spec: RolloutSpec, rollout_id: str, attempt: int) -> dict[str, Any]:
    """The attributes the ``rollway.rollout`` span starts with."""
    return {
        "rollway.rollout_id": rollout_id,
        "rollway.attempt": attempt,
        "rollway.rollout_key": spec.rollout_key,  # stable across attempts and reruns
        "rollway.group_id": spec.group_id,
    }


def end_span(span: tracing.SpanHandle, record: RolloutRecord) -> None:
    """The outcome on the span; an error marks it failed."""
    span.set(
        {
            "rollway.status": record.status,
            "rollway.error_kind": record.error_kind,
            "rollway.reward": record.reward,
        }
    )
    if record.status == "error":
        span.fail(record.reason or "error")
