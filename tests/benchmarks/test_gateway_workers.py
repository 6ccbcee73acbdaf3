"""The short version of benchmarks/gateway_workers.py: one process and two workers behind one
port both answer every turn of every rollout, and the report has its figures."""

from __future__ import annotations

import pytest
from benchmarks.gateway_overhead import TURNS
from benchmarks.gateway_workers import parse, run


@pytest.mark.timeout(300)
def test_one_process_and_two_workers_answer_every_turn() -> None:
    rows = run(parse(["--quick", "--workers", "2", "--concurrency", "8"]))
    assert [(row.workers, row.concurrency) for row in rows] == [(1, 8), (2, 8)]
    for row in rows:
        assert len(row.run.latencies_s) == 8 * TURNS
        assert row.run.turns_per_s > 0
