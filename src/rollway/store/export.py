"""Export an experiment in the shape trainers read: one row per sample (segment).

Columns: ``store.export_columns.COLUMNS`` (name, Arrow type, getter, meaning; docs/trajectory.md
lists them), then one ``reward/<name>`` column (a float; null where a record lacks it) per reward
component any exported record has (``RolloutRecord.reward_components``: a ``Rubric``'s
functions, a reward dict's numeric extras). The record's final messages are not a column (the
whole conversation, repeated on every segment's row): they stay on the record. Records without
token data (a rollout that failed before its first turn) have no rows. ``max_staleness`` drops
samples more than that many versions behind the latest (the newest version in the records
unless ``latest_version`` is given).
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

from rollway.errors import BadRecordError, ConfigError
from rollway.results import RolloutRecord
from rollway.store.base import OnBadRecord
from rollway.store.export_columns import COLUMNS, RecordView, SampleView, arrow_type
from rollway.trajectory import Turn

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
    records = [r for r in records if r.trajectory is not None and aligned(r, on_bad)]
    if drop_flat_groups:
        flat = flat_groups(records)
        records = [r for r in records if r.group_id not in flat]
    latest_version = _latest_version(records, latest_version)
    components = sorted({name for r in records for name in r.reward_components})
    for record in records:
        for row in _record_rows(record, latest_version, max_staleness):
            found = record.reward_components
            yield row | {f"reward/{name}": found.get(name) for name in components}


def aligned(record: RolloutRecord, on_bad: OnBadRecord | None) -> bool:
    """Whether ``record``'s token data line up (``Trajectory.check``); one that does not is
    passed to ``on_bad`` (raised where it is None). Rescore skips what export skips."""
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
    view = RecordView(record, latest_version)
    by_segment: dict[int, list[Turn]] = {}
    for turn in view.trajectory.turns:
        by_segment.setdefault(turn.segment, []).append(turn)
    for sample in view.trajectory.samples:
        turns = by_segment.get(sample.segment, [])
        row = SampleView(view, sample, turns, _oldest(sample.policy_versions, sample.loss_mask))
        stale = row.staleness
        if max_staleness is not None and stale is not None and stale > max_staleness:
            continue
        yield {column.name: column.get(row) for column in COLUMNS}


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
    columns = [(column.name, arrow_type(column.arrow)) for column in COLUMNS]
    # One float column per reward component (``reward/<name>``), after the fixed ones.
    columns += [(name, pa.float64()) for name in (rows[0] if rows else {}) if "/" in name]
    pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema(columns)), path)
