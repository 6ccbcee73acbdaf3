"""A Ctrl-C (or SIGTERM) lands in whichever Python frame runs when it comes. Landing in the
batch's outermost frame, it must still cancel the rest, count every rollout and write the
summary: a wrapper generator there once closed the batch with ``GeneratorExit`` instead, and
the summary left out the cancelled rollouts (an outside tester saw it 2 runs in 7)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

from rollway.client import RolloutClient
from rollway.engines.sim import SimConfig

MakeClient = Callable[..., RolloutClient]


def interrupt_next_line(frame: FrameType) -> None:
    """The next line ``frame`` runs raises ``KeyboardInterrupt``, as a signal landing there."""

    def tracer(traced: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            traced.f_trace = None
            raise KeyboardInterrupt
        return tracer

    sys.settrace(lambda *_: None)  # tracing on, so that the frame's own tracer runs
    frame.f_trace = tracer


@pytest.mark.timeout(60)
def test_an_interrupt_in_the_batchs_outer_frame_counts_every_rollout(
    make_client: MakeClient,
) -> None:
    client = make_client(sim=SimConfig(latency_s=0.05), max_concurrent=2)
    tasks = [{"task_id": f"t{n}"} for n in range(6)]
    batch = client.run_batch(tasks)
    assert next(batch).result.status == "completed"
    frame = getattr(batch, "gi_frame", None)
    assert frame is not None
    interrupt_next_line(frame)
    try:
        with pytest.raises(KeyboardInterrupt):
            next(batch)
    finally:
        sys.settrace(None)
    summary = client.last_summary
    assert summary is not None and summary["interrupted"]
    stored = list(client.store.records())
    assert len(stored) == summary["total"] == len(tasks)
    by_status: dict[str, int] = {}
    for record in stored:
        by_status[record.status] = by_status.get(record.status, 0) + 1
    assert summary["by_status"] == by_status
    assert by_status.get("cancelled", 0) >= 1
