"""Batches: tasks x group size as rollout specs, batch items, and the run's statistics."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollway.client.fingerprint import difference
from rollway.errors import TRANSIENT_KINDS, ConfigError
from rollway.results import RolloutRecord, TrajectoryStats
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


def component_stats(records: Iterable[RolloutRecord]) -> dict[str, dict[str, float | int]]:
    """Each reward component's mean, std (population) and count over the scored ``records``
    that have it (``RolloutRecord.reward_components``), by name: TRL's ``rewards/<func>``."""
    values: dict[str, list[float]] = {}
    for record in records:
        for name, value in record.reward_components.items():
            values.setdefault(name, []).append(value)
    return {
        name: {"mean": statistics.fmean(got), "std": statistics.pstdev(got), "n": len(got)}
        for name, got in sorted(values.items())
    }


@dataclass(frozen=True)
class GroupStats:
    group_id: str
    rewards: list[float]
    infrastructure_failures: int
    #: Each reward component's mean, std and count over the group (``component_stats``).
    components: dict[str, dict[str, float | int]] = field(default_factory=dict)

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.rewards) if self.rewards else None

    @property
    def std(self) -> float | None:
        return statistics.pstdev(self.rewards) if self.rewards else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "n_scored": len(self.rewards),
            "mean_reward": self.mean,
            "std_reward": self.std,
            "infrastructure_failures": self.infrastructure_failures,
            "reward_components": self.components,
        }


def group_stats(records: Iterable[RolloutRecord]) -> list[GroupStats]:
    """Reward mean/std per group over scored rollouts; infrastructure failures are counted and
    left out (they say nothing about the policy)."""
    rewards: dict[str, list[float]] = {}
    scored: dict[str, list[RolloutRecord]] = {}
    infra: Counter[str] = Counter()
    for record in records:
        rewards.setdefault(record.group_id, [])
        if record.error_kind in TRANSIENT_KINDS:
            infra[record.group_id] += 1
        elif record.reward is not None:
            rewards[record.group_id].append(record.reward)
            scored.setdefault(record.group_id, []).append(record)
    return [
        GroupStats(g, rewards[g], infra[g], component_stats(scored.get(g, [])))
        for g in sorted(rewards)
    ]


@dataclass(frozen=True)
class RunSummary:
    """A batch's figures. Outcomes and rewards count every rollout of the batch, those found in
    the store (``resumed``) included; throughput and latency only what this run sampled."""

    by_status: dict[str, int]
    mean_reward: float | None
    tokens_per_s: float
    turn_latency_p50_ms: float | None
    turn_latency_p95_ms: float | None
    wall_s: float
    errors_by_kind: dict[str, int] = field(default_factory=dict)
    #: Each reward component's mean, std and count (``component_stats``).
    reward_components: dict[str, dict[str, float | int]] = field(default_factory=dict)
    resumed: int = 0
    #: Rollouts found in the store and run again, by why (``rerun_reason``).
    rerun: dict[str, int] = field(default_factory=dict)
    sampled_tokens: int = 0
    #: Stopped by Ctrl-C: the rollouts cut short are counted as ``cancelled``.
    interrupted: bool = False

    @property
    def total(self) -> int:
        return sum(self.by_status.values())

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "total": self.total}


def summarize(
    ran: Sequence[RolloutRecord],
    wall_s: float,
    resumed: Sequence[RolloutRecord] = (),
    *,
    interrupted: bool = False,
    rerun: Mapping[str, int] | None = None,
) -> RunSummary:
    """The summary of a batch: ``ran`` in this run for ``wall_s``, ``resumed`` from the store,
    ``rerun`` (by why) found there and run again."""
    records = [*resumed, *ran]
    stats = [_stats(r) for r in ran]
    latencies = sorted(ms for s in stats if s is not None for ms in s.turn_latency_ms)
    tokens = sum(
        s.sampled_tokens
        if s is not None and s.sampled_tokens is not None
        else r.metrics.response_tokens
        for r, s in zip(ran, stats, strict=True)
    )
    return RunSummary(
        **outcome_figures(records),
        tokens_per_s=tokens / wall_s if wall_s > 0 else 0.0,
        turn_latency_p50_ms=_percentile(latencies, 0.50),
        turn_latency_p95_ms=_percentile(latencies, 0.95),
        wall_s=wall_s,
        resumed=len(resumed),
        rerun=dict(rerun or {}),
        sampled_tokens=tokens,
        interrupted=interrupted,
    )


def summary_view(record: RolloutRecord) -> RolloutRecord:
    """What a batch's summary reads of a record (outcome, reward and its components, group,
    the trajectory's figures) and nothing else: a batch keeps one per rollout until its summary
    (100,000 at once on a cluster), the conversation, task and trajectory stay with the item
    the caller got and in the store."""
    return record.light().model_copy(
        update={"messages": [], "task": {}, "fingerprint": None, "reward_history": []}
    )


def outcome_figures(records: Sequence[RolloutRecord]) -> dict[str, Any]:
    """What a summary says of ``records``' outcomes and rewards (a rescore recomputes these)."""
    rewards = [r.reward for r in records if r.reward is not None]
    return {
        "by_status": dict(Counter(r.status for r in records)),
        "mean_reward": statistics.fmean(rewards) if rewards else None,
        "errors_by_kind": dict(Counter(r.error_kind for r in records if r.error_kind)),
        "reward_components": component_stats(records),
    }


def _stats(record: RolloutRecord) -> TrajectoryStats | None:
    """The trajectory's figures, from the trajectory or, on a light record, as carried. Sampled
    tokens are counted from them because program and remote agents count none themselves;
    ``summarize`` falls back on the agent's count where the engine gives no token ids."""
    if record.trajectory is not None:
        return TrajectoryStats.of(record.trajectory)
    return record.trajectory_stats


def _percentile(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
