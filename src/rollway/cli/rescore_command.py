"""``rollway rescore``: a recorded run's rewards computed again, no rollout run again."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rollway.cli.export_command import report_bad
from rollway.cli.failures import EXIT_INTERRUPTED, fail
from rollway.cli.run_command import load_reward
from rollway.client.rescore import RescoreReport, rescore_async
from rollway.errors import BadRecordError, ConfigError, ExperimentInUseError
from rollway.loop_thread import run_to_end
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
    replace_on_failure: Annotated[
        bool,
        typer.Option(
            "--replace-on-failure",
            help="A rollout whose new reward fails becomes error/reward (its old reward in its "
            "history); without it, it keeps its old reward, the failure noted beside.",
        ),
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
    seen: list[RescoreReport] = []  # the latest, told of as it goes: what Ctrl-C reports
    console = Console(stderr=True)
    try:
        with Progress(
            TextColumn("[bold]rescore"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            task = progress.add_task("", total=None)

            def advance(report: RescoreReport) -> None:
                seen[:] = [report]
                progress.update(task, completed=report.done, total=report.chosen)

            report = run_to_end(
                rescore_async(
                    store,
                    reward_fn,
                    failed_only=failed,
                    again=again,
                    replace_on_failure=replace_on_failure,
                    limits=limits,
                    concurrency=concurrency,
                    on_bad=report_bad(bad),
                    on_progress=advance,
                )
            )
    except ExperimentInUseError as exc:
        fail(
            str(exc),
            "rescore once that client has ended: a rescore beside a running client would "
            "overwrite the rollouts it records",
        )
    except KeyboardInterrupt:
        _report_interrupt(seen[0] if seen else None)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    _report(report, replace_on_failure)


def _report(report: RescoreReport, replaced: bool) -> None:
    """The closing line; exit 1 when every rollout chosen failed to score."""
    notes = []
    if report.failed:
        fate = "now error/reward" if replaced else "each keeps its old reward"
        notes.append(f"{report.failed} failed ({fate})")
    if report.changed:
        notes.append(f"{report.changed} written by another client meanwhile, left as they are")
    notes.append(f"{report.skipped} left as they were")
    if report.bad:
        notes.append(f"{len(report.bad)} bad records skipped, named above")
    typer.echo(f"rescored {report.scored} rollouts with {report.reward_fn} ({'; '.join(notes)})")
    if report.failed and not report.scored:
        reason, count = report.reasons.most_common(1)[0]
        fail(
            f"no rollout rescored: {report.failed} of {report.chosen} failed",
            f"{count}x {reason!r}; fix the reward function, then run the same command again",
        )


def _report_interrupt(report: RescoreReport | None) -> None:
    """Ctrl-C: how far the rescore got, and that running it again goes on from there."""
    far = "nothing rescored" if report is None else (
        f"{report.scored} of {report.chosen} rollouts rescored with {report.reward_fn}"
        + (f" ({report.failed} failed)" if report.failed else "")
    )  # fmt: skip
    typer.secho(
        f"interrupted: {far}; run the same command again to go on from there",
        err=True,
        fg="yellow",
    )
