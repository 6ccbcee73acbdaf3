"""Export an experiment in the shape trainers read: one row per sample (segment).

Columns: rollout_id, rollout_key, group_id, group_index, sample_index, segment, status,
finish_reason (the record's: the agent's, ``max_steps`` telling a capped episode from a finished
one, and ``length`` for its default ``stop`` where the rollout was truncated), is_truncated and
truncation_reason (the rollout's one truncation truth, from its trajectory: ``max_turns``,
``max_seq_len``, or ``max_tokens`` where its last turn was cut; null when not truncated: what
overlong filtering such as TRL's ``mask_truncated_completions`` or DAPO's reads), reward,
prompt_ids, response_ids, loss_mask, logprobs, policy_versions (aligned
with response_ids, -1 off the mask; null without versions), policy_version and
policy_version_max (the oldest and the newest version that sampled a token of the sample;
several across a ``keep`` update or in an async run), staleness (the latest version minus the
oldest) and logprob_kind (``raw_logprobs``, ``processed_logprobs``, or ``mixed`` when its turns
differ: never train on those as if they were one kind), raw_logprobs (the temperature-1 ones,
aligned, where ``logprobs`` are not raw; null otherwise), kept_mass (aligned: the mass
top-p/top-k kept for each sampled token, 1.0 where nothing was cut; null when no turn cut),
top_ids and top_logprobs (aligned: each sampled token's most likely ids and their logprobs, []
off the mask; null unless the sampling asked ``top_logprobs``), entropy (aligned, 0.0 off the
mask; null unless it asked ``record_entropy``), temperature, top_p and top_k (the segment's
first turn's sampling), turns (the segment's turn count), task_id (the task's ``task_id``, else
``id``, else null), prompt_messages (the rollout's opening messages, before the model's first
answer: the task as it was asked; JSON text, the same on each of the rollout's rows) and
reward_info (the reward's components and source, as the record has them; JSON text), then one
``reward/<name>`` column (a float; null where a record lacks it) per reward component any
exported record has (``RolloutRecord.reward_components``: a ``Rubric``'s functions, a reward
dict's numeric extras). The
record's final messages are not a column (the whole conversation, repeated on every segment's
row): they stay on the record. Records without token data (a rollout that failed before its
first turn) have no rows. ``max_staleness`` drops samples more than that many versions behind
the latest (the newest version in the records unless ``latest_version`` is given).
``drop_flat_groups`` drops every row of a group whose rewards hold fewer than two different
values among its scored rollouts (zero variance: no GRPO signal); ``flat_groups`` names them.
A record whose token data do not line up (per-token lists not one per completion id, a chain
of prompts that does not match its hashes: ``Trajectory.check``) is reported and skipped, as
the store reports and skips one it cannot read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

import orjson

from rollway import json_text
from rollway.errors import BadRecordError, ConfigError
from rollway.results import RolloutRecord
from rollway.store.base import OnBadRecord
from rollway.trajectory import Sample, Turn

ExportFormat = Literal["jsonl", "parquet"]


def flat_groups(records: Iterable[RolloutRecord]) -> set[str]:
    """The groups whose rewards carry no signal: fewer than two different rewards among their
    scored rollouts (all equal, one scored, or none)."""
    rewards: dict[str, set[float]] = {}
    for record in records:
        scored = rewards.setdefault(record.group_id, set())
        if record.reward is not None:
            scored.add(record.reward)
    return {group for group, values in rewards.items() if len(values) < 2}


def sample_rows(
    records: Iterable[RolloutRecord],
    *,
    latest_version: int | None = None,
    max_staleness: int | None = None,
    drop_flat_groups: bool = False,
    on_bad: OnBadRecord | None = None,
) -> Iterator[dict[str, Any]]:
    """The rows of ``records``. A record whose turns do not line up (``Trajectory.check``) is
    passed to ``on_bad`` and skipped, or raised where no ``on_bad`` is given."""
    records = [r for r in records if r.trajectory is not None and _aligned(r, on_bad)]
    if drop_flat_groups:
        flat = flat_groups(records)
        records = [r for r in records if r.group_id not in flat]
    latest_version = _latest_version(records, latest_version)
    components = sorted({name for r in records for name in r.reward_components})
    for record in records:
        for row in _record_rows(record, latest_version, max_staleness):
            found = record.reward_components
            yield row | {f"reward/{name}": found.get(name) for name in components}


def _aligned(record: RolloutRecord, on_bad: OnBadRecord | None) -> bool:
    assert record.trajectory is not None
    try:
        record.trajectory.check()
    except BadRecordError as exc:
        bad = BadRecordError.of(
            f"record {record.rollout_key} (rollout {record.rollout_id})",
            exc.reason,
            record.rollout_key,
        )
        if on_bad is None:
            raise bad from None
        on_bad(bad)
        return False
    return True


def _latest_version(records: list[RolloutRecord], given: int | None) -> int | None:
    """``given``, or the newest version that sampled a token of ``records``; a ``given`` older
    than that is an error."""
    newest = max(
        (
            max(t.policy_versions)
            for r in records
            if r.trajectory
            for t in r.trajectory.turns
            if t.policy_versions
        ),
        default=None,
    )
    if given is None:
        return newest
    if newest is not None and given < newest:
        raise ConfigError(
            f"latest version {given} is older than version {newest} in the records",
            "latest_version",
        )
    return given


def _record_rows(
    record: RolloutRecord, latest_version: int | None, max_staleness: int | None
) -> Iterator[dict[str, Any]]:
    """The rows of one record's samples, but those more than ``max_staleness`` behind."""
    trajectory = record.trajectory
    assert trajectory is not None
    # The same on each of the record's rows: made once per record, not once per sample.
    tail = {
        "task_id": _task_id(record.task),
        "prompt_messages": _json_text(_opening_messages(record.messages or trajectory.messages)),
        "reward_info": _json_text(record.reward_info),
    }
    by_segment: dict[int, list[Turn]] = {}
    for turn in trajectory.turns:
        by_segment.setdefault(turn.segment, []).append(turn)
    for sample in trajectory.samples:
        oldest = _oldest(sample.policy_versions, sample.loss_mask)
        staleness = None if oldest is None or latest_version is None else latest_version - oldest
        if max_staleness is not None and staleness is not None and staleness > max_staleness:
            continue
        turns = by_segment.get(sample.segment, [])
        sampling = turns[0].sampling if turns else trajectory.sampling
        yield {**_sample_columns(record, sample, turns, sampling, oldest, staleness), **tail}


def _sample_columns(
    record: RolloutRecord,
    sample: Sample,
    turns: list[Turn],
    sampling: dict[str, Any],
    oldest: int | None,
    staleness: int | None,
) -> dict[str, Any]:
    """A row's columns but the record's last three (task, opening messages, reward info)."""
    kinds = {t.logprob_kind for t in turns}
    return {
        "rollout_id": record.rollout_id,
        "rollout_key": record.rollout_key,
        "group_id": record.group_id,
        "group_index": record.group_index,
        "sample_index": record.sample_index,
        "segment": sample.segment,
        "status": record.status,
        "finish_reason": record.finish_reason,
        **_truncation(record),
        "reward": record.reward,
        "prompt_ids": sample.prompt_ids,
        "response_ids": sample.response_ids,
        "loss_mask": sample.loss_mask,
        "logprobs": sample.logprobs,
        "policy_versions": sample.policy_versions,
        "policy_version": oldest,
        "policy_version_max": _newest(sample.policy_versions, sample.loss_mask),
        "staleness": staleness,
        "logprob_kind": kinds.pop() if len(kinds) == 1 else "mixed",
        "raw_logprobs": sample.raw_logprobs,
        "kept_mass": sample.kept_mass,
        "top_ids": sample.top_ids,
        "top_logprobs": sample.top_logprobs,
        "entropy": sample.entropy,
        "temperature": sampling.get("temperature"),
        "top_p": sampling.get("top_p"),
        "top_k": sampling.get("top_k"),
        "turns": len(turns),
    }


def _truncation(record: RolloutRecord) -> dict[str, Any]:
    trajectory = record.trajectory
    return {
        "is_truncated": trajectory is not None and trajectory.is_truncated,
        "truncation_reason": trajectory.truncation_reason if trajectory is not None else None,
    }


def _task_id(task: dict[str, Any]) -> str | None:
    found = task.get("task_id", task.get("id"))
    return None if found is None else str(found)


def _oldest(versions: list[int] | None, mask: list[int]) -> int | None:
    if versions is None:
        return None
    return min((v for v, m in zip(versions, mask, strict=True) if m), default=None)


def _newest(versions: list[int] | None, mask: list[int]) -> int | None:
    if versions is None:
        return None
    return max((v for v, m in zip(versions, mask, strict=True) if m), default=None)


def _opening_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation before the model's first answer: the task as the model was asked."""
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    return messages if first is None else messages[:first]


def _json_text(value: Any) -> str:
    """A column of free-form JSON (messages, reward components) as text: Parquet and
    ``datasets`` need one type per column, and these differ from row to row."""
    return json_text.dumps(value).decode()


def export_records(
    records: Iterable[RolloutRecord],
    path: Path,
    fmt: ExportFormat,
    *,
    latest_version: int | None = None,
    max_staleness: int | None = None,
    drop_flat_groups: bool = False,
    on_bad: OnBadRecord | None = None,
) -> int:
    """Write the sample rows of ``records`` to ``path``; return how many rows. A record that
    cannot be used goes to ``on_bad`` and is skipped (``sample_rows``)."""
    rows = list(
        sample_rows(
            records,
            latest_version=latest_version,
            max_staleness=max_staleness,
            drop_flat_groups=drop_flat_groups,
            on_bad=on_bad,
        )
    )
    if fmt == "jsonl":
        path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    elif fmt == "parquet":
        _write_parquet(rows, path)
    else:
        raise ConfigError(f"unknown export format {fmt!r}: jsonl or parquet")
    return len(rows)


def _write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("Parquet export needs pyarrow: pip install 'rollway[parquet]'") from None
    columns: list[tuple[str, pa.DataType]] = [
        ("rollout_id", pa.string()),
        ("rollout_key", pa.string()),
        ("group_id", pa.string()),
        ("group_index", pa.int64()),
        ("sample_index", pa.int64()),
        ("segment", pa.int64()),
        ("status", pa.string()),
        ("finish_reason", pa.string()),
        ("is_truncated", pa.bool_()),
        ("truncation_reason", pa.string()),
        ("reward", pa.float64()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("logprobs", pa.list_(pa.float64())),
        ("policy_versions", pa.list_(pa.int64())),
        ("policy_version", pa.int64()),
        ("policy_version_max", pa.int64()),
        ("staleness", pa.int64()),
        ("logprob_kind", pa.string()),
        ("raw_logprobs", pa.list_(pa.float64())),
        ("kept_mass", pa.list_(pa.float64())),
        ("top_ids", pa.list_(pa.list_(pa.int32()))),
        ("top_logprobs", pa.list_(pa.list_(pa.float64()))),
        ("entropy", pa.list_(pa.float64())),
        ("temperature", pa.float64()),
        ("top_p", pa.float64()),
        ("top_k", pa.int64()),
        ("turns", pa.int64()),
        ("task_id", pa.string()),
        ("prompt_messages", pa.string()),
        ("reward_info", pa.string()),
    ]
    # One float column per reward component (``reward/<name>``), after the fixed ones.
    columns += [(name, pa.float64()) for name in (rows[0] if rows else {}) if "/" in name]
    pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema(columns)), path)
