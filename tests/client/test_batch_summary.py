"""A batch's summary after a resume: counts cover the whole batch, throughput only this run."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rollway.client import RolloutClient
from rollway.engines.sim import SimConfig


def test_a_resumed_batch_counts_only_the_tokens_it_sampled(
    make_client: Callable[..., RolloutClient],
) -> None:
    client = make_client(SimConfig(output_len=8), exp_id="resumed")
    tasks = [{"task_id": f"t{i}", "chats": 2} for i in range(4)]
    first = list(client.run_batch(tasks[:2]))
    assert all(item.success for item in first)
    second = list(client.run_batch(tasks))
    fresh = [item.result for item in second if not item.from_store]
    assert len(fresh) == 2 and all(record.trajectory is not None for record in fresh)
    sampled = sum(len(t.completion_ids) for r in fresh for t in r.trajectory.turns)
    assert sampled == 2 * 2 * 8
    summary = client.last_summary
    assert summary is not None
    assert summary["total"] == 4 and summary["by_status"] == {"completed": 4}
    assert summary["tokens_per_s"] == pytest.approx(sampled / summary["wall_s"])
    assert summary["resumed"] == 2 and summary["sampled_tokens"] == sampled
