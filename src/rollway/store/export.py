"""Export an experiment in the shape trainers read: one row per sample (segment).

Columns: rollout_id, rollout_key, group_id, group_index, sample_index, segment, status,
finish_reason (the agent's, as on the record: ``max_steps`` tells a capped episode from a
finished one), reward, prompt_ids, response_ids, loss_mask, logprobs, policy_versions (aligned
with response_ids, -1 off the mask; null without versions), policy_version (the oldest version
that sampled a token of the sample), staleness (the latest version minus that one) and
logprob_kind (``raw_logprobs``, ``processed_logprobs``, or ``mixed`` when its turns differ:
never train on those as if they were one kind). The record's final messages are not a column
(text, repeated on every segment's row): they stay on the record. Records without token data
(a rollout that failed before its first turn) have no rows. ``max_staleness`` drops samples
more than that many versions behind the latest (the newest version in the records unless
``latest_version`` is given).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

import orjson

from rollway.errors import ConfigError
from rollway.types import RolloutRecord

ExportFormat = Literal["jsonl", "parquet"]


def sample_rows(
    records: Iterable[RolloutRecord],
    *,
    latest_version: int | None = None,
    max_staleness: int | None = None,
) -> Iterator[dict[str, Any]]:
    records = [r for r in records if r.trajectory is not None]
    newest = max((max(t.policy_versions) for r in records if r.trajectory
                  for t in r.trajectory.turns if t.policy_versions), default=None)  # fmt: skip
    if latest_version is None:
        latest_version = newest
    elif newest is not None and latest_version < newest:
        raise ConfigError(
            f"latest version {latest_version} is older than version {newest} in the records",
            "latest_version",
        )
    for record in records:
        trajectory = record.trajectory
        assert trajectory is not None
        for sample in trajectory.samples:
            oldest = _oldest(sample.policy_versions, sample.loss_mask)
            staleness = (
                None if oldest is None or latest_version is None else latest_version - oldest
            )
            if max_staleness is not None and staleness is not None and staleness > max_staleness:
                continue
            kinds = {t.logprob_kind for t in trajectory.turns if t.segment == sample.segment}
            yield {
                "rollout_id": record.rollout_id,
                "rollout_key": record.rollout_key,
                "group_id": record.group_id,
                "group_index": record.group_index,
                "sample_index": record.sample_index,
                "segment": sample.segment,
                "status": record.status,
                "finish_reason": record.finish_reason,
                "reward": record.reward,
                "prompt_ids": sample.prompt_ids,
                "response_ids": sample.response_ids,
                "loss_mask": sample.loss_mask,
                "logprobs": sample.logprobs,
                "policy_versions": sample.policy_versions,
                "policy_version": oldest,
                "staleness": staleness,
                "logprob_kind": kinds.pop() if len(kinds) == 1 else "mixed",
            }


def _oldest(versions: list[int] | None, mask: list[int]) -> int | None:
    if versions is None:
        return None
    return min((v for v, m in zip(versions, mask, strict=True) if m), default=None)


def export_records(
    records: Iterable[RolloutRecord],
    path: Path,
    fmt: ExportFormat,
    *,
    latest_version: int | None = None,
    max_staleness: int | None = None,
) -> int:
    """Write the sample rows of ``records`` to ``path``; return how many rows."""
    rows = list(sample_rows(records, latest_version=latest_version, max_staleness=max_staleness))
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
    schema = pa.schema(
        [
            ("rollout_id", pa.string()),
            ("rollout_key", pa.string()),
            ("group_id", pa.string()),
            ("group_index", pa.int64()),
            ("sample_index", pa.int64()),
            ("segment", pa.int64()),
            ("status", pa.string()),
            ("finish_reason", pa.string()),
            ("reward", pa.float64()),
            ("prompt_ids", pa.list_(pa.int32())),
            ("response_ids", pa.list_(pa.int32())),
            ("loss_mask", pa.list_(pa.int8())),
            ("logprobs", pa.list_(pa.float64())),
            ("policy_versions", pa.list_(pa.int64())),
            ("policy_version", pa.int64()),
            ("staleness", pa.int64()),
            ("logprob_kind", pa.string()),
        ]
    )
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
