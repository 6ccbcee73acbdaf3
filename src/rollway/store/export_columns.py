"""The export's columns, one table: each column's name, Arrow type, getter and meaning, in the
order of a row. The rows (``store.export``), the Parquet schema and docs/trajectory.md's column
list (a test holds it to this table) all come from ``COLUMNS``: a column is added as one row."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rollway import json_text
from rollway.results import RolloutRecord
from rollway.trajectory import Sample, Trajectory, Turn

if TYPE_CHECKING:
    import pyarrow as pa


class RecordView:
    """One record as its rows see it: what is the same on each of its rows is made once."""

    def __init__(self, record: RolloutRecord, latest_version: int | None) -> None:
        assert record.trajectory is not None
        self.record = record
        self.trajectory: Trajectory = record.trajectory
        self.latest_version = latest_version

    @functools.cached_property
    def task_id(self) -> str | None:
        found = self.record.task.get("task_id", self.record.task.get("id"))
        return None if found is None else str(found)

    @functools.cached_property
    def prompt_messages(self) -> str:
        return _json_text(_opening_messages(self.record.messages or self.trajectory.messages))

    @functools.cached_property
    def reward_info(self) -> str:
        return _json_text(self.record.reward_info)


@dataclass(frozen=True, slots=True)
class SampleView:
    """One sample of a record: the source of one row."""

    of: RecordView
    sample: Sample
    #: The turns of the sample's segment.
    turns: list[Turn]
    #: The oldest version that sampled a token of it (None: no versions).
    oldest: int | None

    @property
    def record(self) -> RolloutRecord:
        return self.of.record

    @property
    def sampling(self) -> dict[str, Any]:
        """The segment's first turn's sampling."""
        return self.turns[0].sampling if self.turns else self.of.trajectory.sampling

    @property
    def staleness(self) -> int | None:
        latest = self.of.latest_version
        return None if self.oldest is None or latest is None else latest - self.oldest


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    #: Arrow's name of the type (``int64``, ``list<int32>``): what Parquet stores.
    arrow: str
    get: Callable[[SampleView], Any]
    #: Its meaning, as docs/trajectory.md gives it.
    doc: str


def _newest(versions: list[int] | None, mask: list[int]) -> int | None:
    if versions is None:
        return None
    return max((v for v, m in zip(versions, mask, strict=True) if m), default=None)


def _logprob_kind(row: SampleView) -> str:
    kinds = {t.logprob_kind for t in row.turns}
    return kinds.pop() if len(kinds) == 1 else "mixed"


def _opening_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation before the model's first answer: the task as the model was asked."""
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    return messages if first is None else messages[:first]


def _json_text(value: Any) -> str:
    """A column of free-form JSON (messages, reward components) as text: Parquet and
    ``datasets`` need one type per column, and these differ from row to row."""
    return json_text.dumps(value).decode()


_ALIGNED = "aligned with `response_ids`"

#: Every fixed column, in the order of a row. After them comes one ``reward/<name>`` column (a
#: float64; null where a record lacks it) per reward component any exported record has.
COLUMNS: tuple[Column, ...] = (
    Column(
        "rollout_id", "string", lambda r: r.record.rollout_id,
        "the gateway's id of its last attempt",
    ),
    Column(
        "rollout_key", "string", lambda r: r.record.rollout_key,
        "stable across reruns: task key + sample index",
    ),
    Column(
        "group_id", "string", lambda r: r.record.group_id,
        "its group: one task's rollouts (GRPO's)",
    ),
    Column(
        "group_index", "int64", lambda r: r.record.group_index,
        "the group's index in its batch",
    ),
    Column(
        "sample_index", "int64", lambda r: r.record.sample_index,
        "the rollout's index in its group",
    ),
    Column(
        "segment", "int64", lambda r: r.sample.segment,
        "the sample's segment (one per history rewrite)",
    ),
    Column("status", "string", lambda r: r.record.status, "the record's status"),
    Column(
        "finish_reason", "string", lambda r: r.record.finish_reason,
        "the record's: the agent's, `max_steps` telling a capped episode from a finished one, "
        "and `length` for its default `stop` where the rollout was truncated",
    ),
    Column(
        "is_truncated", "bool", lambda r: r.of.trajectory.is_truncated,
        "the rollout's one truncation truth, from its trajectory",
    ),
    Column(
        "truncation_reason", "string", lambda r: r.of.trajectory.truncation_reason,
        "`max_turns`, `max_seq_len`, or `max_tokens` where its last turn was cut; null when not "
        "truncated: what overlong filtering (TRL's `mask_truncated_completions`, DAPO's) reads",
    ),
    Column("reward", "float64", lambda r: r.record.reward, "the rollout's reward"),
    Column("prompt_ids", "list<int32>", lambda r: r.sample.prompt_ids, "the segment's prompt"),
    Column(
        "response_ids", "list<int32>", lambda r: r.sample.response_ids,
        "everything the segment added after its prompt",
    ),
    Column(
        "loss_mask", "list<int8>", lambda r: r.sample.loss_mask,
        "1 exactly on engine-sampled ids",
    ),
    Column(
        "logprobs", "list<float64>", lambda r: r.sample.logprobs, f"{_ALIGNED}, 0.0 off the mask"
    ),
    Column(
        "policy_versions", "list<int64>", lambda r: r.sample.policy_versions,
        f"{_ALIGNED}, -1 off the mask; null without versions",
    ),
    Column(
        "policy_version", "int64", lambda r: r.oldest,
        "the oldest version that sampled a token of the sample",
    ),
    Column(
        "policy_version_max", "int64",
        lambda r: _newest(r.sample.policy_versions, r.sample.loss_mask),
        "the newest (several across a `keep` update or in an async run)",
    ),
    Column(
        "staleness", "int64", lambda r: r.staleness,
        "the latest version minus the oldest",
    ),
    Column(
        "logprob_kind", "string", _logprob_kind,
        "`raw_logprobs`, `processed_logprobs`, or `mixed` when its turns differ: never train on "
        "those as if they were one kind",
    ),
    Column(
        "raw_logprobs", "list<float64>", lambda r: r.sample.raw_logprobs,
        f"the temperature-1 ones, {_ALIGNED}, where `logprobs` are not raw; null otherwise",
    ),
    Column(
        "kept_mass", "list<float64>", lambda r: r.sample.kept_mass,
        f"{_ALIGNED}: the mass top-p/top-k kept for each sampled token, 1.0 where nothing was "
        "cut; null when no turn cut",
    ),
    Column(
        "top_ids", "list<list<int32>>", lambda r: r.sample.top_ids,
        f"{_ALIGNED}: each sampled token's most likely ids, [] off the mask; null unless the "
        "sampling asked `top_logprobs`",
    ),
    Column(
        "top_logprobs", "list<list<float64>>", lambda r: r.sample.top_logprobs,
        "their logprobs, as `top_ids`",
    ),
    Column(
        "entropy", "list<float64>", lambda r: r.sample.entropy,
        f"{_ALIGNED}, 0.0 off the mask; null unless the sampling asked `record_entropy`",
    ),
    Column(
        "temperature", "float64", lambda r: r.sampling.get("temperature"),
        "the segment's first turn's sampling",
    ),
    Column("top_p", "float64", lambda r: r.sampling.get("top_p"), "as `temperature`"),
    Column("top_k", "int64", lambda r: r.sampling.get("top_k"), "as `temperature`"),
    Column("turns", "int64", lambda r: len(r.turns), "the segment's turn count"),
    Column(
        "task_id", "string", lambda r: r.of.task_id,
        "the task's `task_id`, else `id`, else null",
    ),
    Column(
        "prompt_messages", "string", lambda r: r.of.prompt_messages,
        "the rollout's opening messages, before the model's first answer: the task as it was "
        "asked; JSON text, the same on each of the rollout's rows",
    ),
    Column(
        "reward_info", "string", lambda r: r.of.reward_info,
        "the reward's components and source, as the record has them; JSON text",
    ),
)  # fmt: skip


def arrow_type(name: str) -> pa.DataType:
    """The Arrow type named ``name`` (``list<list<int32>>``): a column's ``arrow``."""
    import pyarrow as pa

    if name.startswith("list<") and name.endswith(">"):
        return pa.list_(arrow_type(name[len("list<") : -1]))
    plain: dict[str, Callable[[], pa.DataType]] = {
        "string": pa.string, "bool": pa.bool_, "int8": pa.int8, "int32": pa.int32,
        "int64": pa.int64, "float64": pa.float64,
    }  # fmt: skip
    return plain[name]()
