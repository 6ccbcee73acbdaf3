"""What ``rollway run`` says at its end, beyond the summary table: an interrupted run, a run
in which no rollout completed (exit 1, with the reason most of them gave), rollouts left for a
rerun."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import typer

from rollway.cli.failures import fail
from rollway.cli.stopping import what_stopped
from rollway.client.batch import BatchItem, should_rerun

#: What to do when most rollouts ended this way; resume reruns cancelled rollouts,
#: infrastructure and engine failures, and what other settings made (a longer --timeout), so
#: the rest need --no-resume (or a new --exp-id); a failed reward needs no rollout run again.
_ADVICE = {
    "error/infrastructure": "rerun to retry them (resume reruns infrastructure failures)",
    "error/engine": "check the engine (--engine), then rerun (resume reruns engine failures)",
    "error/reward": "fix the reward function, then score the recorded rollouts again, "
    "sampling none: rollway rescore {results} --reward {reward} --failed",
    "error/agent": "fix the agent (`rollway validate AGENT`), then rerun with --no-resume",
    "timeout": "raise --timeout, then rerun (resume runs again what another timeout made)",
    "cancelled": "rerun to resume",
}


def report_interrupt(summary: dict[str, Any] | None, stop: KeyboardInterrupt) -> None:
    """Ctrl-C or SIGTERM: how many rollouts have a record and how many were cut short."""
    what = what_stopped(stop)
    if summary is None or not summary["interrupted"]:
        typer.secho(f"{what}; rerun to resume", err=True, fg="yellow")
        return
    cancelled = summary["by_status"].get("cancelled", 0)
    recorded = summary["total"] - cancelled
    typer.secho(
        f"{what}: {recorded} recorded, {cancelled} cancelled; rerun to resume",
        err=True,
        fg="yellow",
    )


def require_a_completed_rollout(
    items: Sequence[BatchItem], results: str = "RUN", reward: str | None = None
) -> None:
    """Fail, saying why, when no rollout of the batch completed (or was truncated);
    ``results`` (the experiment's folder) and ``reward`` (``--reward``) go in the advice."""
    if any(item.success for item in items):
        return
    outcomes = Counter(_outcome(item) for item in items)
    listed = ", ".join(f"{n} {outcome}" for outcome, n in outcomes.most_common())
    reasons = Counter(item.result.reason for item in items if item.result.reason)
    most, _ = outcomes.most_common(1)[0]
    why = ""
    if reasons:
        reason, count = reasons.most_common(1)[0]
        why = f"{count}x {reason!r}; "
    advice = _ADVICE.get(most, "see the records for each reason")
    fail(
        f"no rollout completed: {len(items)} of {len(items)} failed ({listed})",
        f"{why}{advice.format(results=results, reward=reward or 'FILE.py:FUNCTION')}",
    )


def warn_about_reruns(items: Sequence[BatchItem]) -> None:
    """Some rollouts ended in ways a rerun retries (infrastructure failures, cancels): say so."""
    again = [item for item in items if should_rerun(item.result)]
    if again:
        typer.secho(
            f"warning: {len(again)} of {len(items)} rollouts failed (infrastructure, engine) "
            "or were cancelled; rerun to retry them",
            err=True,
            fg="yellow",
        )


def _outcome(item: BatchItem) -> str:
    record = item.result
    return f"{record.status}/{record.error_kind}" if record.error_kind else record.status
