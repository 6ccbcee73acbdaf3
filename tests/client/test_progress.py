from __future__ import annotations

import logging
import time

import pytest
from rich.table import Table

from rollway.client.batch import summarize
from rollway.client.progress import BatchProgress, summary_table
from rollway.results import RolloutRecord, TrajectoryStats


def record(status: str, reward: float | None) -> RolloutRecord:
    return RolloutRecord(
        exp_id="e", rollout_key=f"k{reward}", rollout_id="r", task_index=0, group_id="g",
        group_index=0, sample_index=0, status=status, reward=reward, started_at=time.time(),
        elapsed_s=1.0,
    )  # fmt: skip


def test_status_lines_report_counts_and_mean_reward(caplog: pytest.LogCaptureFixture) -> None:
    progress = BatchProgress(3, show=False, status_interval_s=0.0)
    with caplog.at_level(logging.INFO, logger="rollway.client"), progress:
        progress.advance(record("completed", 1.0))
        progress.advance(record("error", None))
    assert caplog.messages[-1] == (
        "batch status: 2/3 done after 0 s; completed 1, error 1 | mean reward 1.000"
    )


def test_status_lines_report_each_reward_components_mean(
    caplog: pytest.LogCaptureFixture,
) -> None:
    progress = BatchProgress(3, show=False, status_interval_s=0.0)
    scored = [
        record("completed", 1.0).model_copy(update={"reward_info": {"correct": 1.0, "brief": 0.5}}),
        record("completed", 0.0).model_copy(update={"reward_info": {"correct": 0.0}}),
    ]
    with caplog.at_level(logging.INFO, logger="rollway.client"), progress:
        for one in scored:
            progress.advance(one)
    assert caplog.messages[-1].endswith(
        "completed 2 | mean reward 0.500 | reward/brief 0.500, reward/correct 0.500"
    )


def test_summary_counts_outcomes_and_rewards() -> None:
    summary = summarize(
        [record("completed", 1.0), record("completed", 0.0), record("timeout", None)], 2.0
    )
    assert summary.by_status == {"completed": 2, "timeout": 1} and summary.total == 3
    assert summary.mean_reward == 0.5 and summary.turn_latency_p50_ms is None
    assert summary_table(summary).row_count >= 5


def test_summary_counts_resumed_records_but_not_their_tokens() -> None:
    stored = record("completed", 1.0).model_copy(
        update={"trajectory_stats": TrajectoryStats(turns=1, sampled_tokens=300,
                                                    turn_latency_ms=[900.0])}
    )  # fmt: skip
    ran = record("completed", 0.0).model_copy(
        update={"trajectory_stats": TrajectoryStats(turns=2, sampled_tokens=20,
                                                    turn_latency_ms=[10.0, 30.0])}
    )  # fmt: skip
    summary = summarize([ran], 2.0, resumed=[stored])
    assert summary.total == 2 and summary.resumed == 1 and summary.mean_reward == 0.5
    assert summary.sampled_tokens == 20 and summary.tokens_per_s == 10.0
    assert summary.turn_latency_p95_ms == 30.0  # stored turns were timed in another run
    rows = {cells[0]: cells[1] for cells in table_cells(summary_table(summary))}
    assert rows["  from the store"] == "1" and rows["tokens sampled"] == "20"


def table_cells(table: Table) -> list[tuple[str, str]]:
    columns = [list(column.cells) for column in table.columns]
    return list(zip(*columns, strict=True))
