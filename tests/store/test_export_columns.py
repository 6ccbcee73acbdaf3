"""The export's columns are one table (``store.export_columns.COLUMNS``): the rows, the Parquet
schema and docs/trajectory.md's column list all follow it."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from rollway.store import export_records
from rollway.store.export import sample_rows
from rollway.store.export_columns import COLUMNS, arrow_type
from tests.store.test_export_versions import RECORDS

DOCS = Path(__file__).resolve().parents[2] / "docs" / "trajectory.md"


def documented_columns() -> list[tuple[str, str, str]]:
    """(name, type, meaning) of each row of the column table under docs/trajectory.md's
    "The export"."""
    section = DOCS.read_text().split("\n## The export\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| ([^|]+) \| (.+) \|$", section, flags=re.MULTILINE)
    return [(name, kind.strip(), meaning.strip()) for name, kind, meaning in rows]


def test_the_docs_list_the_columns_of_the_table_in_order_with_their_types_and_meanings() -> None:
    assert documented_columns() == [(c.name, c.arrow, c.doc) for c in COLUMNS]


def test_a_row_has_the_tables_columns_in_order_then_the_reward_components() -> None:
    scored = RECORDS[0].model_copy(update={"reward_info": {"acc": 1.0, "source": "rubric"}})
    row, *_ = sample_rows([scored, *RECORDS[1:]])
    assert list(row) == [c.name for c in COLUMNS] + ["reward/acc"]


def test_the_parquet_schema_is_the_tables(tmp_path: Path) -> None:
    path = tmp_path / "rows.parquet"
    export_records(RECORDS, path, "parquet")
    schema = pq.read_schema(path)
    assert schema.names == [c.name for c in COLUMNS]
    assert [schema.field(c.name).type for c in COLUMNS] == [arrow_type(c.arrow) for c in COLUMNS]
    assert arrow_type("list<list<int32>>") == pa.list_(pa.list_(pa.int32()))
    # The JSONL rows are the same rows, the same bytes orjson makes of them.
    export_records(RECORDS, tmp_path / "rows.jsonl", "jsonl")
    expected = b"".join(orjson.dumps(row) + b"\n" for row in sample_rows(RECORDS))
    assert (tmp_path / "rows.jsonl").read_bytes() == expected
