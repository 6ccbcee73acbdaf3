"""Batches: tasks x group size as rollout specs, batch items, and what resume runs again
(their figures: ``client.batch_summary``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rollway.client.batch_summary import (
    BatchTally as BatchTally,
)
from rollway.client.batch_summary import (
    GroupStats as GroupStats,
)
from rollway.client.batch_summary import (
    RunSummary as RunSummary,
)
from rollway.client.batch_summary import (
    component_stats as component_stats,
)
from rollway.client.batch_summary import (
    group_stats as group_stats,
)
from rollway.client.batch_summary import (
    outcome_figures as outcome_figures,
)
from rollway.client.batch_summary import (
    summarize as summarize,
)
from rollway.client.fingerprint import difference
from rollway.errors import TRANSIENT_KINDS, ConfigError
from rollway.results import RolloutRecord
from rollway.rollouts import RolloutSpec, task_key


@dataclass(frozen=True, slots=True)
class BatchItem:
    """One finished rollout of a batch, in completion order. ``index`` is its position in the
    expanded batch (task i, sample j: ``i * group_size + j``)."""

    success: bool
    result: RolloutRecord
    error: str | None
    index: int
    elapsed: float
    from_store: bool = False

    @classmethod
    def of(
        cls, record: RolloutRecord, index: int, elapsed: float, from_store: bool = False
    ) -> BatchItem:
        error = None if record.success else f"{record.status}: {record.reason}"
        return cls(record.success, record, error, index, elapsed, from_store)


def plan(
    tasks: Sequence[dict[str, Any]],
    group_size: int,
    exp_id: str,
    run_id: str | None = None,
    fingerprint: dict[str, Any] | None = None,
) -> list[RolloutSpec]:
    """``group_size`` specs per task, sharing a group id; keys stable across reruns."""
    if group_size < 1:
        raise ConfigError("group_size must be a whole number of at least 1", "group_size")
    specs = []
    seen: set[str] = set()
    for index, task in enumerate(tasks):
        key = task_key(task)
        if key in seen:  # two identical rows stay two tasks
            key = f"{key}-{index}"
        seen.add(key)
        for sample in range(group_size):
            group = f"{exp_id}:{key}"
            specs.append(
                RolloutSpec(
                    task, index, key, group, index, sample, run_id=run_id, fingerprint=fingerprint
                )
            )
    return specs


def should_rerun(record: RolloutRecord | None) -> bool:
    """Resume reruns rollouts with no record, cancelled ones, and infrastructure and engine
    failures: those say nothing about the policy."""
    return record is None or record.status == "cancelled" or record.error_kind in TRANSIENT_KINDS


def rerun_reason(record: RolloutRecord, fingerprint: dict[str, Any]) -> str | None:
    """Why resume runs a stored rollout again (None: its record is returned): its outcome
    says nothing about the policy (``should_rerun``), or another policy version or other
    settings made it (``client.fingerprint``)."""
    if should_rerun(record):
        return record.status if record.error_kind is None else f"error/{record.error_kind}"
    return difference(record.fingerprint, fingerprint)
