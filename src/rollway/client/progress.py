"""What a long batch shows: a live progress bar, periodic status lines, a closing summary."""

from __future__ import annotations

import logging
import statistics
import time
from array import array
from collections import Counter
from collections.abc import Callable
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rollway.client.batch import RunSummary
from rollway.results import RolloutRecord

log = logging.getLogger("rollway.client")

DEFAULT_STATUS_INTERVAL_S = 30.0


class BatchProgress:
    """Counts outcomes as they arrive; draws a bar when ``show`` is set. A status line comes
    every ``status_interval_s`` whether or not anything finished (the batch's loop waits at most
    ``until_status()`` and then calls ``tick``), so a stuck batch still reports; ``stuck`` says
    how many rollouts the watchdog finds stuck now, ``outages`` what rollouts wait for."""

    def __init__(
        self,
        total: int,
        *,
        show: bool,
        status_interval_s: float = DEFAULT_STATUS_INTERVAL_S,
        stuck: Callable[[], int] = lambda: 0,
        outages: Callable[[], list[str]] = list,
    ) -> None:
        self.console = Console(stderr=True)
        self.counts: Counter[str] = Counter()
        #: The rewards' sum and count: the mean on every advance costs no pass over them all.
        self._reward_sum, self._rewarded = 0.0, 0
        #: Each reward component's values so far, by name (a rubric's functions, say).
        #: Each reward component's values so far: 8 bytes each, not a float object.
        self.components: dict[str, array[float]] = {}
        self._interval = status_interval_s
        self._stuck = stuck
        self._outages = outages
        self._started = self._last_status = time.monotonic()
        self._progress = Progress(
            TextColumn("[bold]rollouts"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=self.console,
            disable=not show,
        )
        self.total = total
        self._task = self._progress.add_task("", total=total)

    def __enter__(self) -> BatchProgress:
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()

    def advance(self, record: RolloutRecord) -> None:
        self.counts[record.status] += 1
        if record.reward is not None:
            self._reward_sum += record.reward
            self._rewarded += 1
        for name, value in record.reward_components.items():
            self.components.setdefault(name, array("d")).append(value)
        self._progress.update(self._task, advance=1, description=self.describe())
        self.tick()

    def until_status(self) -> float:
        """Seconds until the next status line is due."""
        return max(0.0, self._last_status + self._interval - time.monotonic())

    def tick(self) -> None:
        """Write a status line if one is due."""
        if self.until_status() == 0.0:
            self._last_status = time.monotonic()
            self.status_line()

    def status_line(self) -> None:
        done = sum(self.counts.values())
        elapsed = time.monotonic() - self._started
        line = f"batch status: {done}/{self.total} done after {elapsed:.0f} s; {self.describe()}"
        if self.components:  # the status line only: the bar's text stays short
            means = (f"{n} {statistics.fmean(v):.3f}" for n, v in sorted(self.components.items()))
            line += f" | reward/{', reward/'.join(means)}"
        if stuck := self._stuck():
            line += f" | {stuck} stuck"
        for outage in self._outages():
            line += f" | {outage}"
        if self._progress.disable:
            log.info(line)
        else:
            self._progress.console.log(line)  # printed above the live bar

    def describe(self) -> str:
        parts = [f"{status} {n}" for status, n in sorted(self.counts.items())]
        mean = f"{self._reward_sum / self._rewarded:.3f}" if self._rewarded else "-"
        return f"{', '.join(parts) or 'none finished'} | mean reward {mean}"


def summary_table(summary: RunSummary) -> Table:
    title = "rollway run summary (interrupted)" if summary.interrupted else "rollway run summary"
    table = Table(title=title, show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("rollouts", str(summary.total))
    if summary.resumed:
        table.add_row("  from the store", str(summary.resumed))
    for why, n in sorted(summary.rerun.items()):
        table.add_row(f"  stored, run again: {why}", str(n))
    for status, n in sorted(summary.by_status.items()):
        table.add_row(f"  {status}", str(n))
    for kind, n in sorted(summary.errors_by_kind.items()):
        table.add_row(f"  error kind {kind}", str(n))
    table.add_row("mean reward", _fmt(summary.mean_reward, "{:.3f}"))
    for name, stats in summary.reward_components.items():
        table.add_row(f"  reward/{name}", f"{stats['mean']:.3f} ± {stats['std']:.3f}")
    # Throughput and latency are this run's: resumed rollouts were sampled in another.
    table.add_row("tokens sampled", str(summary.sampled_tokens))
    table.add_row("tokens/s (sampled)", f"{summary.tokens_per_s:.1f}")
    table.add_row("turn latency p50", _fmt(summary.turn_latency_p50_ms, "{:.0f} ms"))
    table.add_row("turn latency p95", _fmt(summary.turn_latency_p95_ms, "{:.0f} ms"))
    table.add_row("wall time", f"{summary.wall_s:.1f} s")
    return table


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)
