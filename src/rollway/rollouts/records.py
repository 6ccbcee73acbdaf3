"""A rollout's one record, whatever its outcome."""

from __future__ import annotations

from typing import Any

from rollway.errors import ErrorKind
from rollway.results import RolloutMetrics, RolloutRecord, Status
from rollway.rollouts.config import RolloutConfig
from rollway.rollouts.spec import RolloutSpec, attempt_id
from rollway.trajectory import Trajectory


def make_record(
    spec: RolloutSpec,
    settings: RolloutConfig,
    status: Status,
    error_kind: ErrorKind | None,
    reason: str | None,
    *,
    attempts: int,
    started_at: float,
    elapsed_s: float = 0.0,
    **fields: Any,
) -> RolloutRecord:
    """A rollout's record; ``fields`` holds the rest (reward, trajectory, metrics, messages,
    ...). With a trajectory, what the agent left out is taken from it: the final messages,
    the model-call metrics of calls that did not go through ``ctx.chat``, the policy version.
    A ``stop`` finish (``ctx.complete``'s default) of a truncated rollout is recorded as
    ``length``: the model did not stop; any other reason the agent gave is kept."""
    trajectory: Trajectory | None = fields.get("trajectory")
    if trajectory is not None:
        if trajectory.is_truncated and fields.get("finish_reason") == "stop":
            fields["finish_reason"] = "length"
        fields.setdefault("policy_version", trajectory.oldest_policy_version())
        if not fields.get("messages"):
            fields["messages"] = trajectory.messages
        if "metrics" in fields:
            fields["metrics"] = with_recorded_calls(fields["metrics"], trajectory)
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
        fingerprint=spec.fingerprint,
        **fields,
    )


def with_recorded_calls(metrics: RolloutMetrics, trajectory: Trajectory) -> RolloutMetrics:
    """``metrics`` with its model-call figures taken from the gateway's turns when the agent's
    context counted none: the agent called the gateway over HTTP (a program, an SDK pointed at
    ``ctx.base_url``), past ``ctx.chat``. Token counts need token ids (0 behind a chat-level
    engine, whose turns hold none); latency is the gateway's, engine time only."""
    turns = trajectory.turns
    if metrics.llm_calls or not turns:
        return metrics
    return metrics.model_copy(
        update={
            "llm_calls": len(turns),
            "llm_latency_ms": sum(turn.latency_ms for turn in turns),
            "prompt_tokens": sum(turn.prompt_len for turn in turns),
            "response_tokens": sum(len(turn.completion_ids) for turn in turns),
            "max_context": max(turn.prompt_len + len(turn.completion_ids) for turn in turns),
        }
    )
