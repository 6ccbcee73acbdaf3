"""A batch's figures (outcomes, rewards and their components, groups, tokens, turn latencies),
counted as its rollouts finish: a batch keeps counters and numbers, never its records (the
caller has each one, and the store; 100,000 at once on a cluster)."""

from __future__ import annotations

import statistics
from array import array
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollway.errors import TRANSIENT_KINDS
from rollway.results import RolloutRecord, TrajectoryStats


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


class _Group:
    """One group's scored rewards, infrastructure failures and scored components."""

    __slots__ = ("components", "infrastructure", "rewards")

    def __init__(self) -> None:
        self.rewards: list[float] = []
        self.infrastructure = 0
        self.components: dict[str, list[float]] | None = None  # most groups have none


class BatchTally:
    """A batch's figures, each record counted once (``add``) and let go: what a summary and
    the groups' statistics say, the same as from the whole list of records. About 0.2 KB a
    rollout with a group each, a float per turn for the latencies."""

    def __init__(self) -> None:
        self.by_status: Counter[str] = Counter()
        self.errors_by_kind: Counter[str] = Counter()
        self._rewards = array("d")
        self._components: dict[str, array[float]] = {}
        self._groups: dict[str, _Group] = {}
        self._latencies = array("d")
        self.tokens = 0
        self.ran = 0
        self.resumed = 0

    def add(self, record: RolloutRecord, *, ran: bool = True) -> None:
        """Count ``record``: one this run sampled (``ran``) or found in the store."""
        self.by_status[record.status] += 1
        if record.error_kind:
            self.errors_by_kind[record.error_kind] += 1
        components = record.reward_components
        for name, value in components.items():
            self._components.setdefault(name, array("d")).append(value)
        if record.reward is not None:
            self._rewards.append(record.reward)
        self._add_to_group(record, components)
        if ran:
            self.ran += 1
            self._add_sampled(record)
        else:
            self.resumed += 1

    def _add_to_group(self, record: RolloutRecord, components: dict[str, float]) -> None:
        group = self._groups.get(record.group_id)
        if group is None:
            group = self._groups[record.group_id] = _Group()
        if record.error_kind in TRANSIENT_KINDS:
            group.infrastructure += 1
        elif record.reward is not None:
            group.rewards.append(record.reward)
            for name, value in components.items():
                group.components = group.components or {}
                group.components.setdefault(name, []).append(value)

    def _add_sampled(self, record: RolloutRecord) -> None:
        """Tokens and turn latencies: from the trajectory's figures (program and remote agents
        count no tokens themselves), else the agent's count where the engine gave no ids."""
        stats = _stats(record)
        if stats is not None:
            self._latencies.extend(stats.turn_latency_ms)
        if stats is not None and stats.sampled_tokens is not None:
            self.tokens += stats.sampled_tokens
        else:
            self.tokens += record.metrics.response_tokens

    def outcome_figures(self) -> dict[str, Any]:
        """What a summary says of the outcomes and rewards (a rescore recomputes these)."""
        return {
            "by_status": dict(self.by_status),
            "mean_reward": statistics.fmean(self._rewards) if self._rewards else None,
            "errors_by_kind": dict(self.errors_by_kind),
            "reward_components": _spread(self._components),
        }

    def groups(self) -> list[GroupStats]:
        """Reward mean/std per group over scored rollouts; infrastructure failures are counted
        and left out (they say nothing about the policy)."""
        return [
            GroupStats(
                name,
                group.rewards,
                group.infrastructure,
                _spread(group.components) if group.components else {},
            )
            for name, group in sorted(self._groups.items())
        ]

    def summary(
        self, wall_s: float, *, interrupted: bool = False, rerun: Mapping[str, int] | None = None
    ) -> RunSummary:
        latencies = sorted(self._latencies)
        return RunSummary(
            **self.outcome_figures(),
            tokens_per_s=self.tokens / wall_s if wall_s > 0 else 0.0,
            turn_latency_p50_ms=_percentile(latencies, 0.50),
            turn_latency_p95_ms=_percentile(latencies, 0.95),
            wall_s=wall_s,
            resumed=self.resumed,
            rerun=dict(rerun or {}),
            sampled_tokens=self.tokens,
            interrupted=interrupted,
        )


def tally(ran: Iterable[RolloutRecord], resumed: Iterable[RolloutRecord] = ()) -> BatchTally:
    counted = BatchTally()
    for record in resumed:
        counted.add(record, ran=False)
    for record in ran:
        counted.add(record)
    return counted


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
    return tally(ran, resumed).summary(wall_s, interrupted=interrupted, rerun=rerun)


def group_stats(records: Iterable[RolloutRecord]) -> list[GroupStats]:
    """Reward mean/std per group over ``records`` (``BatchTally.groups``)."""
    return tally((), records).groups()


def outcome_figures(records: Iterable[RolloutRecord]) -> dict[str, Any]:
    """What a summary says of ``records``' outcomes and rewards."""
    return tally((), records).outcome_figures()


def component_stats(records: Iterable[RolloutRecord]) -> dict[str, dict[str, float | int]]:
    """Each reward component's mean, std (population) and count over the scored ``records``
    that have it (``RolloutRecord.reward_components``), by name: TRL's ``rewards/<func>``."""
    values: dict[str, list[float]] = {}
    for record in records:
        for name, value in record.reward_components.items():
            values.setdefault(name, []).append(value)
    return _spread(values)


def _spread(values: Mapping[str, Sequence[float]]) -> dict[str, dict[str, float | int]]:
    return {
        name: {"mean": statistics.fmean(got), "std": statistics.pstdev(got), "n": len(got)}
        for name, got in sorted(values.items())
    }


def _stats(record: RolloutRecord) -> TrajectoryStats | None:
    """The trajectory's figures, from the trajectory or, on a light record, as carried."""
    if record.trajectory is not None:
        return TrajectoryStats.of(record.trajectory)
    return record.trajectory_stats


def _percentile(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
