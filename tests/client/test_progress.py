from __future__ import annotations

import logging
import time

import pytest

from rollway.client.batch import summarize
from rollway.client.progress import BatchProgress, summary_table
from rollway.types import RolloutRecord


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
    assert caplog.messages[-1] == "batch status: 2/3 done; completed 1, error 1 | mean reward 1.000"


def test_summary_counts_outcomes_and_rewards() -> None:
    summary = summarize(
        [record("completed", 1.0), record("completed", 0.0), record("timeout", None)], 2.0
    )
    assert summary.by_status == {"completed": 2, "timeout": 1} and summary.total == 3
    assert summary.mean_reward == 0.5 and summary.turn_latency_p50_ms is None
    assert summary_table(summary).row_count >= 5
