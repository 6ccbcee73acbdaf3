"""What a step source keeps per group (its samples, their refills) and what it hands a trainer:
``StepBatch`` (whole groups) with its ``StepMetrics``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from rollway.client.future import RolloutFuture
from rollway.errors import TRANSIENT_KINDS
from rollway.results import RolloutRecord
from rollway.rollouts import RolloutSpec

#: What happens to a rollout whose oldest token is more than ``max_staleness`` versions behind
#: the trainer's weights when its group is ready: run again under the current weights
#: (``restart``), its group dropped and the task requeued (``drop``), or handed over with its
#: versions (``keep``: the trainer importance-corrects it).
StalePolicy = Literal["restart", "drop", "keep"]
STALE_POLICIES: tuple[str, ...] = ("restart", "drop", "keep")

#: What becomes of a sample that ended without a reward for a reason of its own (a timeout, a
#: reward that failed, an agent error): run again in its group, a timeout or a failed reward
#: (``refill``; an agent error sets its group aside, as running it again mostly repeats it),
#: or handed over as recorded, its status and reason with it (``hand``).
Unscored = Literal["refill", "hand"]
UNSCORED: tuple[str, ...] = ("refill", "hand")


@dataclass(eq=False)
class Slot:
    """One sample of a group: the attempt running for it, then its record."""

    spec: RolloutSpec
    future: RolloutFuture | None = None
    record: RolloutRecord | None = None
    refills: int = 0


@dataclass(eq=False)
class Group:
    """One task's ``group_size`` samples. ``failed``: why a sample could not be had (its
    refills ran out); such a group is set aside, never handed over."""

    position: int
    #: The task's identity in the stream (``task_stream.Identity``): what is settled.
    identity: tuple[str, int]
    task: dict[str, Any]
    instance: int
    slots: list[Slot]
    failed: str | None = None

    @property
    def done(self) -> bool:
        return all(slot.record is not None for slot in self.slots)

    @property
    def records(self) -> list[RolloutRecord]:
        return [slot.record for slot in self.slots if slot.record is not None]

    @property
    def flat(self) -> bool:
        """Every reward the same (no advantage to learn from), a missing reward included."""
        return len({record.reward for record in self.records}) <= 1


def needs_refill(record: RolloutRecord, unscored: Unscored = "hand") -> str | None:
    """Why a finished rollout says nothing about the policy and must be run again (an
    infrastructure or engine failure, or a cancel by someone else than the source; with
    ``unscored="refill"`` a timeout or a failed reward too), else None."""
    transient = record.error_kind in TRANSIENT_KINDS or record.status == "cancelled"
    unrewarded = record.status == "timeout" or record.error_kind == "reward"
    if transient or (unscored == "refill" and unrewarded):
        return _why(record)
    return None


def sets_aside(record: RolloutRecord, unscored: Unscored) -> str | None:
    """Why a finished rollout that is not refilled keeps its group out of a batch: with
    ``unscored="refill"``, any error left (an agent's own), else None."""
    if unscored == "refill" and record.status == "error":
        return _why(record)
    return None


def _why(record: RolloutRecord) -> str:
    kind = record.error_kind or record.status
    return f"{kind}: {record.reason}" if record.reason else kind


def behind(record: RolloutRecord, version: int | None) -> int | None:
    """How many versions its oldest token is behind ``version`` (None: no versions)."""
    if version is None or record.policy_version is None:
        return None
    return version - record.policy_version


def token_staleness(records: list[RolloutRecord], version: int | None) -> Counter[int]:
    """Sampled tokens by how many versions behind ``version`` their weights are. A light
    record (from a Ray worker) counts its sampled tokens at its oldest version."""
    histogram: Counter[int] = Counter()
    if version is None:
        return histogram
    for record in records:
        if record.trajectory is None:
            lag = behind(record, version)
            if lag is not None:
                histogram[lag] += record.metrics.response_tokens
            continue
        for turn in record.trajectory.turns:
            histogram.update(version - v for v in turn.policy_versions or [] if v >= 0)
    return histogram


@dataclass
class StepMetrics:
    """What a step took. Set-aside, refill and staleness counts are those since the previous
    batch was handed over (work done while the trainer trained counts towards this step)."""

    step: int = 0
    groups_used: int = 0
    #: Groups short of ``groups_per_step`` (dynamic sampling hit its cap, or tasks ran out).
    lacking: int = 0
    #: Flat groups (every reward the same) set aside by dynamic sampling.
    set_aside_flat: int = 0
    #: Groups set aside because a sample's refills ran out (``failures`` says why).
    set_aside_failed: int = 0
    #: Samples run again after an infrastructure failure, by error kind.
    refilled: dict[str, int] = field(default_factory=dict)
    #: Groups still running (or ready) when the batch was handed over: they go on.
    carried_over: int = 0
    dropped_stale: int = 0
    restarted_stale: int = 0
    #: Tokens handed over, by versions behind the trainer's weights at hand-over.
    staleness: dict[int, int] = field(default_factory=dict)
    #: Seconds the trainer waited in ``next_batch``.
    wait_s: float = 0.0
    #: The reasons for each refill and failed group: ``{"group_id", "sample", "reason"}``.
    failures: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.__dict__,
            "staleness": {str(k): v for k, v in sorted(self.staleness.items())},
        }

    def line(self) -> str:
        """The status line of a handed batch."""
        refills = sum(self.refilled.values())
        stale = ", ".join(f"{k}: {v}" for k, v in sorted(self.staleness.items())) or "none"
        lacking = f" (lacking {self.lacking})" if self.lacking else ""
        return (
            f"step {self.step}: {self.groups_used} groups{lacking}; set aside "
            f"{self.set_aside_flat} flat, {self.set_aside_failed} failed; {refills} refilled; "
            f"{self.carried_over} carried over; stale {self.dropped_stale} dropped, "
            f"{self.restarted_stale} restarted; tokens by versions behind: {stale}; "
            f"waited {self.wait_s:.2f} s"
        )


@dataclass(frozen=True)
class StepBatch:
    """One step's batch: ``groups`` whole groups (each its records in sample order), in the
    order they finished; ``lacking`` groups short of ``groups_per_step``; ``policy_version``
    the trainer's weights at hand-over. Its tasks are settled (a restarted source does not
    run them again) once the trainer is done with it: ``done()``, its next ``next_batch``, or
    the source closed without an exception."""

    step: int
    groups: list[list[RolloutRecord]]
    lacking: int
    policy_version: int | None
    metrics: StepMetrics
    _settle: Callable[[], None] | None = field(default=None, repr=False, compare=False)

    def done(self) -> None:
        """Say that the trainer is done with this batch (trained on it, or skipped it): its
        tasks are settled and the store says so at once."""
        if self._settle is not None:
            self._settle()

    @property
    def records(self) -> list[RolloutRecord]:
        return [record for group in self.groups for record in group]

    def __len__(self) -> int:
        return len(self.groups)
