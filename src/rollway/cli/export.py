"""``rollway export``: an experiment folder as JSONL or Parquet rows for a trainer."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rollway.errors import ConfigError
from rollway.store.export import ExportFormat, export_records
from rollway.store.file import FileStore


def export(
    run: Annotated[Path, typer.Argument(help="An experiment folder (rollway-runs/<exp_id>).")],
    format: Annotated[str, typer.Option("--format", help="parquet or jsonl")] = "parquet",
    output: Annotated[Path | None, typer.Option(help="Default: <run>/samples.<format>.")] = None,
) -> None:
    """Write one row per sample: ids, loss mask, logprobs, reward, group id, status."""
    if format not in ("parquet", "jsonl"):
        raise ConfigError(f"unknown format {format!r}: parquet or jsonl")
    if not (run / "trajectories").is_dir():
        raise ConfigError(f"{run} is not an experiment folder (no trajectories/)")
    fmt: ExportFormat = "parquet" if format == "parquet" else "jsonl"
    store = FileStore(run.parent, run.name)
    target = output or run / f"samples.{format}"
    rows = export_records(store.records(), target, fmt)
    typer.echo(f"wrote {rows} rows to {target}")
