"""The short version of benchmarks/long_tail.py: both modes hand over only completed rollouts,
every token of a version the engine served, staleness within the bound, and the step source
takes its steps faster than waiting for every rollout."""

from __future__ import annotations

import tempfile

import pytest
from benchmarks.long_tail import parse, step_source, wait_for_every_rollout


@pytest.mark.timeout(300)
def test_the_step_source_beats_waiting_for_every_rollout_and_loses_nothing() -> None:
    args = parse(["--steps", "4", "--groups", "4", "--group-size", "2", "--train-s", "0",
                  "--long-share", "0.3", "--max-staleness", "3"])  # fmt: skip
    with tempfile.TemporaryDirectory() as store:
        waited, stepped = wait_for_every_rollout(args, store), step_source(args, store)
    assert waited.bad == [] and stepped.bad == []
    assert max(stepped.staleness) <= 3 and stepped.tokens > 0
    assert stepped.steps_per_min > waited.steps_per_min
