"""What a rollout ends with: the agent's ``AgentResult`` (what ``run`` returns), an agent
server's ``AgentReport`` while and after it runs, and the ``RolloutRecord`` a store keeps (with
its ``RolloutMetrics`` and, once stored, its ``TrajectoryStats``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, model_validator

from rollway.checks import finite_float, is_number, shown_number
from rollway.errors import ErrorKind
from rollway.trajectory import Trajectory, WireModel

Status = Literal["completed", "truncated", "error", "timeout", "cancelled"]

#: What rollway itself keeps in a record's ``reward_info``: never a component of the reward.
RESERVED_INFO = frozenset(
    {"reward", "source", "agent_reward", "tries", "reward_fn", "judge_calls", "rescore_failed"}
)


@dataclass(frozen=True, slots=True)
class AgentResult:
    """What an agent's ``run`` returns: made by ``ctx.complete(...)`` or ``ctx.error(...)``."""

    messages: list[dict[str, Any]]
    finish_reason: str = "stop"
    reward: float | None = None
    error: str | None = None


class RolloutMetrics(WireModel):
    """Counters of one attempt: its context counts the model calls made through ``ctx.chat``
    and the tool calls; an agent that calls the gateway over HTTP instead (a program, an SDK)
    gets its model-call figures from the turns the gateway recorded."""

    llm_calls: int = 0
    llm_latency_ms: float = 0.0
    tool_calls: int = 0
    tool_latency_ms: float = 0.0
    prompt_tokens: int = 0
    response_tokens: int = 0
    max_context: int = 0
    total_latency_ms: float = Field(
        default=0.0,
        description="Wall time of the agent's run, stop included (0: it never started); the "
        "record's elapsed_s spans every attempt.",
    )


class TrajectoryStats(WireModel):
    """What a run summary needs of a trajectory, for records that travel without it."""

    turns: int
    sampled_tokens: int | None = Field(description="None where the engine gave no token ids.")
    turn_latency_ms: list[float]

    @classmethod
    def of(cls, trajectory: Trajectory) -> TrajectoryStats:
        sampled = sum(len(turn.completion_ids) for turn in trajectory.turns)
        return cls(
            turns=len(trajectory.turns),
            sampled_tokens=sampled if trajectory.has_token_ids else None,
            turn_latency_ms=[turn.latency_ms for turn in trajectory.turns],
        )


class PastReward(WireModel):
    """A scoring a rescore replaced (``rollway rescore``): what the record said before."""

    reward: float | None
    reward_info: dict[str, Any]
    status: Status
    error_kind: ErrorKind | None
    reason: str | None
    reward_fn: str | None = Field(
        description="What scored it: module:function, a rubric, 'agent', or None: not known."
    )
    replaced_at: float


class RolloutRecord(WireModel):
    """The one recorded outcome of one rollout, as the store keeps it."""

    exp_id: str
    rollout_key: str = Field(description="Stable across reruns: task key + sample index.")
    rollout_id: str = Field(description="The gateway's id of the last attempt.")
    task_index: int
    group_id: str
    group_index: int
    sample_index: int
    status: Status
    error_kind: ErrorKind | None = None
    reason: str | None = None
    reward: float | None = None
    reward_info: dict[str, Any] = Field(default_factory=dict)
    attempts: int = 1
    started_at: float
    elapsed_s: float
    metrics: RolloutMetrics = Field(default_factory=RolloutMetrics)
    messages: list[dict[str, Any]] = Field(
        default_factory=list,
        description="The final conversation the agent passed to ctx.complete or ctx.error; "
        "where it passed none (a program agent, a timeout), the gateway's recorded one.",
    )
    finish_reason: str | None = Field(
        default=None,
        description="Why the agent ended, as it told ctx.complete (stop, max_steps, ...); "
        "error from ctx.error; None when it returned nothing (timeout, cancel, a raise).",
    )
    task: dict[str, Any] = Field(default_factory=dict)
    cleanup_errors: list[str] = Field(default_factory=list)
    run_id: str | None = Field(default=None, description="The batch (or invoke) it was run in.")
    policy_version: int | None = Field(
        default=None,
        description="The oldest weights version that sampled any of its tokens (staleness is "
        "the latest version minus this); None without versioned tokens.",
    )
    fingerprint: dict[str, Any] | None = Field(
        default=None,
        description="What made it: the client's policy version, model, agent, reward function, "
        "fixed sampling and limits (docs/running.md#resume). Resume returns a stored record "
        "only when its fingerprint is the batch's; None (an older record) is run again.",
    )
    reward_history: list[PastReward] = Field(
        default_factory=list,
        description="The scorings rescores replaced, oldest first; reward and reward_info are "
        "the latest (reward_info.reward_fn names what gave them, where a rescore did).",
    )
    trajectory: Trajectory | None = None
    trajectory_stats: TrajectoryStats | None = Field(
        default=None, description="Set on light copies, whose trajectory stays in the store."
    )

    @model_validator(mode="before")
    @classmethod
    def _conversation_once(cls, data: Any) -> Any:
        """A stored record's trajectory may keep its conversation as a count of the record's
        messages (``stored``)."""
        trajectory = data.get("trajectory") if isinstance(data, dict) else None
        if isinstance(trajectory, dict) and "messages_in_record" in trajectory:
            trajectory = dict(trajectory)
            count = trajectory.pop("messages_in_record")
            messages = data.get("messages")
            whole = isinstance(count, int) and not isinstance(count, bool)
            if not whole or not isinstance(messages, list) or not 0 <= count <= len(messages):
                raise ValueError("trajectory.messages_in_record: not a count of the messages")
            trajectory.setdefault("messages", messages[:count])
            data = {**data, "trajectory": trajectory}
        return data

    @model_validator(mode="after")
    def _finite_reward(self) -> RolloutRecord:
        """A reward and its components are finite floats (``rollouts/rewards.as_reward``): a
        stored record holding a NaN, an infinity or an int no float holds (put there by hand,
        or by an older version) is a bad record, rerun by resume and skipped by the export,
        never a number that poisons a mean or stops a reader."""
        if self.reward is not None and not math.isfinite(self.reward):
            raise ValueError(f"reward: {self.reward!r} is no finite float")
        for name, value in self.reward_info.items():
            if name not in RESERVED_INFO and is_number(value) and finite_float(value) is None:
                raise ValueError(f"reward_info.{name}: {shown_number(value)} is no finite float")
        return self

    @property
    def reward_components(self) -> dict[str, float]:
        """The components of the reward, from ``reward_info``: each number a reward function
        returned beside its ``reward`` (a ``Rubric``'s functions, a dict's extras); none
        while the record has no reward."""
        if self.reward is None:
            return {}
        return {
            name: number
            for name, value in self.reward_info.items()
            if name not in RESERVED_INFO and (number := finite_float(value)) is not None
        }

    @property
    def success(self) -> bool:
        return self.status in ("completed", "truncated")

    def stored(self) -> bytes:
        """The record as a store keeps it: JSON, with the final conversation once. Where the
        trajectory's conversation begins the record's (the agent ended on the gateway's, or
        added tool results after it), the trajectory keeps only how many of the record's
        messages it is (``messages_in_record``); reading it back puts them in again."""
        trajectory = self.trajectory
        count = len(trajectory.messages) if trajectory is not None else 0
        if trajectory is None or not count or self.messages[:count] != trajectory.messages:
            return self.model_dump_json().encode()
        # Spliced at the ends of the two objects: a field's text never holds a bare brace.
        record = self.model_dump_json(exclude={"trajectory"})
        inner = trajectory.model_dump_json(exclude={"messages"})
        marked = f'{inner[:-1]},"messages_in_record":{count}}}'
        return f'{record[:-1]},"trajectory":{marked}}}'.encode()

    def light(self) -> RolloutRecord:
        """This record without its trajectory (kept in the store), with the trajectory's
        figures: what a Ray worker sends back to the driver."""
        if self.trajectory is None:
            return self
        stats = TrajectoryStats.of(self.trajectory)
        return self.model_copy(update={"trajectory": None, "trajectory_stats": stats})


ReportStatus = Literal["running", "completed", "error", "timeout", "cancelled"]


class AgentReport(WireModel):
    """What an agent server reports about one rollout it ran: to the client's callback, to
    the store (``agent-reports/<run_key>.json``) and from its status route. The trajectory is
    not here: the gateway that recorded it hands it to the client."""

    run_key: str = Field(description="The idempotency key the rollout was started with.")
    rollout_id: str
    agent: str
    status: ReportStatus
    error_kind: ErrorKind | None = None
    reason: str | None = None
    messages: list[dict[str, Any]] = Field(default_factory=list)
    finish_reason: str | None = None
    reward: float | None = None
    metrics: RolloutMetrics = Field(default_factory=RolloutMetrics)
    started_at: float
    finished_at: float | None = None

    @property
    def finished(self) -> bool:
        return self.status != "running"


__all__ = [
    "AgentReport",
    "AgentResult",
    "ReportStatus",
    "RolloutMetrics",
    "RolloutRecord",
    "Status",
    "TrajectoryStats",
]
