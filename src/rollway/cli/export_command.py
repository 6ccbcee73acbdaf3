"""``rollway export``: an experiment folder as JSONL or Parquet rows for a trainer."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rollway.errors import ConfigError
from rollway.store.export import ExportFormat, export_records, flat_groups
from rollway.store.factory import store_from_uri


def export(
    run: Annotated[
        str,
        typer.Argument(help="An experiment: rollway-runs/<exp_id> or s3://bucket/prefix/<exp_id>."),
    ],
    format: Annotated[str, typer.Option("--format", help="parquet or jsonl")] = "parquet",
    output: Annotated[Path | None, typer.Option(help="Default: ./<exp_id>.<format>.")] = None,
    max_staleness: Annotated[
        int | None,
        typer.Option(min=0, help="Drop samples more than this many policy versions behind."),
    ] = None,
    latest_version: Annotated[
        int | None,
        typer.Option(min=0, help="The version staleness counts from (default: the newest seen)."),
    ] = None,
    drop_flat_groups: Annotated[
        bool,
        typer.Option(help="Drop groups whose rewards are all equal (no GRPO signal)."),
    ] = False,
) -> None:
    """Write one row per sample: ids, loss mask, logprobs, reward, group id, status."""
    if format not in ("parquet", "jsonl"):
        raise ConfigError(f"unknown format {format!r}: parquet or jsonl")
    fmt: ExportFormat = "parquet" if format == "parquet" else "jsonl"
    root, _, exp_id = run.rstrip("/").rpartition("/")
    if "://" not in run and not (Path(run) / "trajectories").is_dir():
        raise ConfigError(f"{run} is not an experiment folder (no trajectories/)")
    store = store_from_uri(root or ".", exp_id)
    target = output or Path(f"{exp_id}.{format}")
    records = list(store.records())
    rows = export_records(
        records,
        target,
        fmt,
        latest_version=latest_version,
        max_staleness=max_staleness,
        drop_flat_groups=drop_flat_groups,
    )
    dropped = f" ({len(flat_groups(records))} flat groups dropped)" if drop_flat_groups else ""
    typer.echo(f"wrote {rows} rows to {target}{dropped}")
