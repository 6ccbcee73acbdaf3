"""A batch's summary after a resume: counts cover the whole batch, throughput only this run."""

from __future__ import annotations

import gc
from collections.abc import Callable

import pytest

from rollway.client import RolloutClient
from rollway.engines.sim import SimConfig
from rollway.results import RolloutRecord
from rollway.trajectory import Trajectory


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


def test_a_batch_holds_no_record_the_caller_let_go_until_its_summary(
    make_client: Callable[..., RolloutClient],
) -> None:
    """A batch keeps a small view of each finished rollout for its summary, not the record: at
    100,000 rollouts, records with their conversations held to the end would be gigabytes."""
    client = make_client(SimConfig(output_len=8), exp_id="slim")
    tasks = [{"task_id": f"t{i}", "chats": 2, "reward": 0.5} for i in range(6)]
    for seen, item in enumerate(client.run_batch(tasks), 1):
        assert item.result.trajectory is not None and item.result.messages
        if seen == len(tasks):  # every earlier item dropped by the caller
            gc.collect()
            trajectories = [  # this batch's: other tests' may live on in this process
                o
                for o in gc.get_objects()
                if type(o) is Trajectory and o.rollout_id.startswith("slim.")
            ]
            assert trajectories == [item.result.trajectory]
        del item
    summary = client.last_summary
    assert summary is not None and summary["by_status"] == {"completed": 6}
    assert summary["sampled_tokens"] == 6 * 2 * 8


def _records_of(prefix: str) -> list[RolloutRecord]:
    return [
        o for o in gc.get_objects() if type(o) is RolloutRecord and o.rollout_id.startswith(prefix)
    ]


def test_a_batch_keeps_no_record_for_its_summary(
    make_client: Callable[..., RolloutClient],
) -> None:
    """The summary's figures are counted as each rollout finishes (``BatchTally``): the batch
    keeps no copy of a record the caller let go, only counters and numbers."""
    client = make_client(SimConfig(output_len=8), exp_id="tally")
    tasks = [{"task_id": f"t{i}", "reward": i / 10} for i in range(8)]
    for seen, item in enumerate(client.run_batch(tasks, group_size=2), 1):
        if seen == 2 * len(tasks):
            gc.collect()
            assert _records_of("tally.") == [item.result]
        del item
    summary = client.last_summary
    assert summary is not None and summary["by_status"] == {"completed": 16}
    assert summary["mean_reward"] == pytest.approx(0.35)
    assert summary["turn_latency_p50_ms"] is not None and summary["sampled_tokens"] == 16 * 8


def test_a_finished_rollout_is_freed_when_let_go_with_no_collection(
    make_client: Callable[..., RolloutClient],
) -> None:
    """Nothing a finished rollout leaves (its handle, futures, record) is in a reference cycle:
    it is freed when the caller lets it go, not at a full collection, which at 100,000
    rollouts walks millions of objects with every thread stopped."""
    client = make_client(SimConfig(output_len=4), exp_id="acyclic")
    list(client.run_batch([{"task_id": "warm"}]))  # start-up's own objects made
    gc.collect()
    gc.disable()
    try:
        for item in client.run_batch([{"task_id": f"t{i}"} for i in range(12)]):
            assert item.success
        del item
        future = client.invoke({"task_id": "one"})
        assert future.result(timeout=60).success
        del future
        assert _records_of("acyclic.") == []
    finally:
        gc.enable()
