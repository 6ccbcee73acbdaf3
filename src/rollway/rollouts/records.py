"""A rollout's one record, whatever its outcome."""

from __future__ import annotations

from typing import Any

from rollway.rollouts.spec import RolloutSettings, RolloutSpec, attempt_id
from rollway.types import ErrorKind, RolloutRecord, Status


def make_record(
    spec: RolloutSpec,
    settings: RolloutSettings,
    status: Status,
    error_kind: ErrorKind | None,
    reason: str | None,
    *,
    attempts: int,
    started_at: float,
    elapsed_s: float = 0.0,
    **fields: Any,
) -> RolloutRecord:
    """A rollout's record; ``fields`` holds the rest (reward, trajectory, metrics, ...)."""
    trajectory = fields.get("trajectory")
    if trajectory is not None and "policy_version" not in fields:
        fields["policy_version"] = trajectory.oldest_policy_version()
    return RolloutRecord(
        exp_id=settings.exp_id,
        rollout_key=spec.rollout_key,
        rollout_id=attempt_id(settings, spec, attempts),
        task_index=spec.task_index,
        group_id=spec.group_id,
        group_index=spec.group_index,
        sample_index=spec.sample_index,
        status=status,
        error_kind=error_kind,
        reason=reason,
        attempts=attempts,
        started_at=started_at,
        elapsed_s=elapsed_s,
        task=spec.task,
        run_id=spec.run_id,
        **fields,
    )
