"""``rollway rescore``: a recorded run's rewards computed again, no rollout run again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rollway.cli.export_command import report_bad
from rollway.cli.run_command import load_reward
from rollway.client.rescore import rescore_async
from rollway.errors import BadRecordError, ConfigError
from rollway.rollouts import RolloutLimits
from rollway.store.factory import store_from_uri


def rescore(
    run: Annotated[
        str,
        typer.Argument(help="An experiment: rollway-runs/<exp_id> or s3://bucket/prefix/<exp_id>."),
    ],
    reward: Annotated[str, typer.Option(help="The reward: module:fn or file.py:fn.")],
    failed: Annotated[
        bool, typer.Option("--failed", help="Only the rollouts whose reward failed.")
    ] = False,
    again: Annotated[
        bool, typer.Option("--again", help="Also those this function has scored already.")
    ] = False,
    concurrency: Annotated[int, typer.Option(min=1, help="Rollouts scored at once.")] = 8,
    reward_timeout: Annotated[float, typer.Option(min=0, help="Seconds a try may take.")] = 30.0,
    reward_retries: Annotated[
        int, typer.Option(min=0, max=20, help="Tries again a try that raised or timed out.")
    ] = 2,
) -> None:
    """Score a recorded run's rollouts again: new rewards beside the old, groups.json and
    summary.json made again; a rescore cut short goes on where it stopped when run again."""
    root, _, exp_id = run.rstrip("/").rpartition("/")
    if "://" not in run and not (Path(run) / "trajectories").is_dir():
        raise ConfigError(f"{run} is not an experiment folder (no trajectories/)", "run")
    store = store_from_uri(root or ".", exp_id)
    reward_fn = load_reward(reward)
    limits = RolloutLimits(reward_timeout=reward_timeout, reward_retries=reward_retries)
    bad: list[BadRecordError] = []
    console = Console(stderr=True)
    with Progress(
        TextColumn("[bold]rescore"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("", total=None)

        def advance(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        report = asyncio.run(
            rescore_async(
                store,
                reward_fn,
                failed_only=failed,
                again=again,
                limits=limits,
                concurrency=concurrency,
                on_bad=report_bad(bad),
                on_progress=advance,
            )
        )
    said = f"rescored {report.scored} rollouts with {report.reward_fn}"
    notes = [f"{report.failed} failed (error/reward)"] if report.failed else []
    notes.append(f"{report.skipped} left as they were")
    if report.bad:
        notes.append(f"{len(report.bad)} bad records skipped, named above")
    typer.echo(f"{said} ({'; '.join(notes)})")
