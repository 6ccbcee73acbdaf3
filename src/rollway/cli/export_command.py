"""``rollway export``: an experiment folder as JSONL or Parquet rows for a trainer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from rollway.errors import BadRecordError, ConfigError
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
    bad: list[BadRecordError] = []
    records = list(store.records(on_bad=report_bad(bad)))
    rows = export_records(
        records,
        target,
        fmt,
        latest_version=latest_version,
        max_staleness=max_staleness,
        drop_flat_groups=drop_flat_groups,
        on_bad=report_bad(bad),
    )
    notes = [f"{len(flat_groups(records))} flat groups dropped"] if drop_flat_groups else []
    if bad:
        notes.append(f"{len(bad)} bad records skipped, named above")
    typer.echo(f"wrote {rows} rows to {target}" + (f" ({'; '.join(notes)})" if notes else ""))


def report_bad(bad: list[BadRecordError]) -> Callable[[BadRecordError], None]:
    """Name each record that cannot be used, on stderr, as it is skipped."""

    def report(error: BadRecordError) -> None:
        bad.append(error)
        typer.secho(f"warning: skipped {error}", err=True, fg="yellow")

    return report
