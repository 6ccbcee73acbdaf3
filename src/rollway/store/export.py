"""Export an experiment in the shape trainers read: one row per sample (segment).

Columns: rollout_id, rollout_key, group_id, group_index, sample_index, segment, status,
reward, prompt_ids, response_ids, loss_mask, logprobs. Records without token data (a rollout
that failed before its first turn) have no rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

import orjson

from rollway.errors import ConfigError
from rollway.types import RolloutRecord

ExportFormat = Literal["jsonl", "parquet"]


def sample_rows(records: Iterable[RolloutRecord]) -> Iterator[dict[str, Any]]:
    for record in records:
        if record.trajectory is None:
            continue
        for sample in record.trajectory.samples:
            yield {
                "rollout_id": record.rollout_id,
                "rollout_key": record.rollout_key,
                "group_id": record.group_id,
                "group_index": record.group_index,
                "sample_index": record.sample_index,
                "segment": sample.segment,
                "status": record.status,
                "reward": record.reward,
                "prompt_ids": sample.prompt_ids,
                "response_ids": sample.response_ids,
                "loss_mask": sample.loss_mask,
                "logprobs": sample.logprobs,
            }


def export_records(records: Iterable[RolloutRecord], path: Path, fmt: ExportFormat) -> int:
    """Write the sample rows of ``records`` to ``path``; return how many rows."""
    rows = list(sample_rows(records))
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
            ("reward", pa.float64()),
            ("prompt_ids", pa.list_(pa.int32())),
            ("response_ids", pa.list_(pa.int32())),
            ("loss_mask", pa.list_(pa.int8())),
            ("logprobs", pa.list_(pa.float64())),
        ]
    )
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
