"""A large batch starts its rollouts a slice at a time: the client's event loop takes each
slice before the next is submitted, so anything else on the loop (a status line, a weight
update, a cancel) waits behind one slice, not the whole batch."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from rollway.client import RolloutClient, batch_runs
from rollway.engines.sim import SimConfig


def test_a_batch_never_has_more_than_a_slice_of_starts_waiting_on_the_loop(
    make_client: Callable[..., RolloutClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batch_runs, "START_SLICE", 8)
    client = make_client(SimConfig(output_len=1), exp_id="slices")
    waiting, most, lock = 0, 0, threading.Lock()
    submit = client._loop.submit

    def counted(coro: Coroutine[Any, Any, Any]) -> Any:
        nonlocal waiting, most
        with lock:
            waiting += 1
            most = max(most, waiting)

        async def started() -> Any:
            nonlocal waiting
            with lock:
                waiting -= 1
            return await coro

        return submit(started())

    monkeypatch.setattr(client._loop, "submit", counted)
    tasks = [{"task_id": f"t{i}"} for i in range(200)]
    items = list(client.run_batch(tasks))
    assert len(items) == 200 and all(item.success for item in items)
    assert most <= 8 + 1  # a slice, and the call that waits for the loop to take it


def test_a_batch_left_early_still_records_the_rollouts_it_had_not_started(
    make_client: Callable[..., RolloutClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batch_runs, "START_SLICE", 4)
    client = make_client(SimConfig(output_len=1), exp_id="left")
    tasks = [{"task_id": f"t{i}", "wait": 0.05} for i in range(40)]
    batch = client.run_batch(tasks)
    next(batch)
    batch.close()
    summary = client.last_summary
    assert summary is None or summary["total"] <= 40
    keys = client.store.keys()
    assert len(keys) == 40  # each rollout recorded: finished, or cancelled


def test_an_async_batch_never_has_more_than_a_slice_of_starts_waiting_on_the_loop(
    make_client: Callable[..., RolloutClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run_batch_async`` starts its rollouts in the same slices, each awaited (the caller's
    loop goes on meanwhile), not the whole batch submitted at once."""
    monkeypatch.setattr(batch_runs, "START_SLICE", 8)
    client = make_client(SimConfig(output_len=1), exp_id="async-slices")
    waiting, most, lock = 0, 0, threading.Lock()
    submit = client._loop.submit

    def counted(coro: Coroutine[Any, Any, Any]) -> Any:
        nonlocal waiting, most
        with lock:
            waiting += 1
            most = max(most, waiting)

        async def started() -> Any:
            nonlocal waiting
            with lock:
                waiting -= 1
            return await coro

        return submit(started())

    monkeypatch.setattr(client._loop, "submit", counted)
    tasks = [{"task_id": f"t{i}"} for i in range(200)]

    async def collect() -> list[Any]:
        return [item async for item in client.run_batch_async(tasks)]

    items = asyncio.run(collect())
    assert len(items) == 200 and all(item.success for item in items)
    assert sorted(item.index for item in items) == list(range(200))
    assert most <= 8 + 1  # a slice, and the call that says when the loop took it


def test_a_batch_freezes_its_rollouts_in_flight_out_of_collections_until_it_ends(
    make_client: Callable[..., RolloutClient],
) -> None:
    """The state of rollouts in flight is frozen (``gc.freeze``) after each slice, so a full
    collection does not walk it, and given back to the collector when the batch ends."""
    client = make_client(SimConfig(output_len=1), exp_id="frozen")
    frozen_during = []
    for item in client.run_batch([{"task_id": f"t{i}"} for i in range(20)]):
        assert item.success
        frozen_during.append(gc.get_freeze_count())
    assert min(frozen_during) > 0
    assert gc.get_freeze_count() == 0
