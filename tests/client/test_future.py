"""``RolloutFuture``: cancel answers exactly how the rollout ends; await it from any loop."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from rollway.client import RolloutClient
from rollway.client.future import CancelGate
from rollway.engines.sim import SimConfig
from rollway.results import RolloutRecord
from rollway.trajectory import Trajectory
from tests.agents.server.fixtures import wait_until
from tests.client.conftest import ScriptedAgent

MakeClient = Callable[..., RolloutClient]


def test_cancel_after_the_outcome_is_recorded_is_refused_and_changes_nothing(
    make_client: MakeClient,
) -> None:
    client = make_client()
    future = client.invoke({"task_id": "done", "reward": 1.0})
    record = future.result(timeout=30)
    assert future.cancel() is False
    assert future.result() is record and not future.cancelled
    assert record.status == "completed" and record.reward == 1.0
    assert client.store.get(record.rollout_key) == record


def test_cancel_while_running_is_granted_and_recorded_as_cancelled(
    make_client: MakeClient,
) -> None:
    client = make_client(sim=SimConfig(latency_s=60.0))
    future = client.invoke({"task_id": "hang"})
    wait_until(lambda: ScriptedAgent.running == 1)
    assert future.cancel() is True
    assert future.cancel() is True  # asked again: the answer stands
    record = future.result(timeout=10)
    assert record.status == "cancelled" and record.reason == "cancelled by the caller"
    assert future.cancelled and future.cancel() is False
    assert client.store.get(record.rollout_key) == record


def test_a_cancel_granted_while_a_finished_rollout_is_scored_makes_it_cancelled(
    make_client: MakeClient,
) -> None:
    scoring, release = threading.Event(), threading.Event()

    def reward(task: dict[str, Any], trajectory: Trajectory) -> float:
        scoring.set()
        release.wait(30)
        return 1.0

    client = make_client(reward=reward)
    future = client.invoke({"task_id": "late"})
    try:
        assert scoring.wait(30)  # the agent has completed; its outcome is not recorded yet
        assert future.cancel() is True
    finally:
        release.set()
    record = future.result(timeout=30)
    assert record.status == "cancelled" and future.cancelled
    assert record.reason == "cancelled by the caller as it ended (completed)"
    assert record.reward is None and record.trajectory is not None and record.trajectory.turns
    assert client.store.get(record.rollout_key) == record  # the store says so too


def test_cancel_answers_exactly_how_a_rollout_racing_to_its_end_is_recorded(
    make_client: MakeClient,
) -> None:
    client = make_client()
    started = time.monotonic()
    client.invoke({"task_id": "warm", "wait": 0.01}).result(timeout=30)
    typical = time.monotonic() - started
    answers: Counter[tuple[bool, str]] = Counter()
    for i in range(40):
        future = client.invoke({"task_id": f"race{i}", "wait": 0.01, "reward": 1.0})
        time.sleep(typical * 2 * i / 40)  # from at once to past the rollout's usual end
        granted = future.cancel()
        record = future.result(timeout=30)
        assert granted == (record.status == "cancelled") == future.cancelled, record.reason
        stored = client.store.get(record.rollout_key)
        assert stored is not None and stored.status == record.status
        answers[granted, record.status] += 1
    assert answers[True, "cancelled"] and answers[False, "completed"], answers


def test_result_async_awaits_from_any_event_loop_without_blocking_it(
    make_client: MakeClient,
) -> None:
    client = make_client()
    future = client.invoke({"task_id": "async", "wait": 0.2, "reward": 0.5})

    async def await_and_tick() -> tuple[RolloutRecord, int]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while not future.done():
                ticks += 1
                await asyncio.sleep(0.005)

        record, _ = await asyncio.gather(future.result_async(), tick())
        return record, ticks

    with ThreadPoolExecutor(2) as pool:  # two more loops, each on its own thread
        elsewhere = [pool.submit(asyncio.run, future.result_async()) for _ in range(2)]
        record, ticks = asyncio.run(await_and_tick())
        assert [f.result(timeout=30) for f in elsewhere] == [record, record]
    assert ticks > 1  # the loop went on while the record was awaited
    assert isinstance(record, RolloutRecord) and record.reward == 0.5
    invoked = asyncio.run(client.invoke_async({"task_id": "invoked", "reward": 0.25}))
    assert isinstance(invoked, RolloutRecord) and invoked.reward == 0.25


def test_cancelling_the_awaiting_task_cancels_the_rollout_with_a_record(
    make_client: MakeClient,
) -> None:
    client = make_client(sim=SimConfig(latency_s=60.0))
    future = client.invoke({"task_id": "awaited"})
    wait_until(lambda: ScriptedAgent.running == 1)

    async def awaited() -> RolloutRecord:
        return await future

    async def await_then_give_up() -> None:
        waiting = asyncio.ensure_future(awaited())
        await asyncio.sleep(0)  # let it start waiting
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(await_then_give_up())
    record = future.result(timeout=10)  # a record, not a rollout torn down half-way
    assert record.status == "cancelled" and record.reason == "cancelled by the caller"
    assert client.store.get(record.rollout_key) == record


def test_a_light_record_overruled_by_a_cancel_keeps_its_trajectory_in_the_store(
    make_client: MakeClient,
) -> None:
    client = make_client()
    full = client.invoke({"task_id": "light"}).result(timeout=30)

    async def overrule() -> RolloutRecord:  # as a Ray worker's light record reaches the driver
        gate = CancelGate(asyncio.get_running_loop())
        assert gate.request() is True
        kept = await gate.settle(full.light(), client.store)
        assert gate.request() is False  # settled
        return kept

    kept = asyncio.run(overrule())
    assert kept.status == "cancelled" and kept.trajectory is None and kept.trajectory_stats
    stored = client.store.get(full.rollout_key)
    assert stored is not None and stored.status == "cancelled"
    assert stored.trajectory == full.trajectory and stored.trajectory is not None
