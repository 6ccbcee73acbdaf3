"""A reward's time is bounded whatever it does: sync graders that hang for ever (more of them
than the default executor has threads), an async one that swallows its cancellation."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

import rollway
from rollway.client import RolloutClient
from rollway.rollouts import RolloutLimits
from rollway.rollouts.reward_threads import REWARD_THREADS
from rollway.trajectory import Trajectory
from tests.cli.test_run_failures import AGENT_SOURCE

MakeClient = Callable[..., RolloutClient]

#: More hung graders than the default executor's threads (min(32, cores + 4): 6 on 2 cores).
HUNG = 8
QUICK = RolloutLimits(reward_timeout=0.5, reward_retries=0, stop_grace_s=0.2, timeout=20)


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """What lets this test's hung rewards go at its end (a stuck thread cannot be stopped)."""
    released = threading.Event()
    yield released
    released.set()


@pytest.mark.timeout(120, method="thread")  # a hang must fail, not hold the suite
def test_sync_rewards_that_hang_for_ever_are_each_recorded_and_spare_the_store(
    make_client: MakeClient, release: threading.Event
) -> None:
    def hang(task: dict[str, Any], trajectory: Trajectory) -> float:
        release.wait()
        return 1.0

    client = make_client(reward=hang, limits=QUICK)
    items = list(client.run_batch([{"task_id": f"t{i}"} for i in range(HUNG)]))
    assert len(items) == HUNG
    for item in items:
        record = item.result
        assert (record.status, record.error_kind) == ("error", "reward"), record.reason
        assert record.reason == "reward function timed out after 0.5 s"
    # Each was written: the store's off-loop work did not wait behind the hung threads.
    assert len(list(client.store.records())) == HUNG
    assert REWARD_THREADS.running >= HUNG  # each stuck thread was left, a new one started


@pytest.mark.timeout(120, method="thread")  # a hang must fail, not hold the suite
def test_an_async_reward_that_swallows_its_cancel_is_abandoned_with_a_warning(
    make_client: MakeClient, release: threading.Event, caplog: pytest.LogCaptureFixture
) -> None:
    async def stubborn(task: dict[str, Any], trajectory: Trajectory) -> float:
        while not release.is_set():
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue  # swallowed, as a careless grader does
        return 1.0

    client = make_client(reward=stubborn, limits=QUICK)
    with caplog.at_level(logging.WARNING, logger="rollway.rollouts.rewards"):
        items = list(client.run_batch([{"task_id": "a"}, {"task_id": "b"}]))
    for item in items:
        record = item.result
        assert (record.status, record.error_kind) == ("error", "reward")
        reason = record.reason or ""
        assert reason.startswith("reward function timed out after 0.5 s; it ignored")
        assert "abandoned, still running" in reason
    warned = [r for r in caplog.records if "ignored its cancellation" in r.getMessage()]
    assert len(warned) == 2 and "stubborn" in warned[0].getMessage()


@pytest.mark.timeout(120, method="thread")  # a hang must fail, not hold the suite
def test_a_rescore_whose_async_reward_swallows_its_cancel_returns(
    make_client: MakeClient, release: threading.Event
) -> None:
    """``rollway.rescore`` (and ``rollway rescore``) run their own loop: the abandoned reward
    left on it is not waited for once the work is done (``asyncio.run`` would, for ever)."""

    async def stubborn(task: dict[str, Any], trajectory: Trajectory) -> float:
        while not release.is_set():
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue
        return 1.0

    client = make_client(reward=lambda task, trajectory: 0.5)
    assert all(item.success for item in client.run_batch([{"task_id": "a"}]))
    report = rollway.rescore(client.store, stubborn, limits=QUICK)
    assert (report.scored, report.failed) == (0, 1)
    (record,) = client.store.records()
    assert record.reward == 0.5 and "rescore_failed" in record.reward_info


HUNG_REWARD = """\
import threading


def hang(task, trajectory):
    threading.Event().wait()  # for ever: nothing sets it
"""


@pytest.mark.timeout(120, method="thread")  # a hang must fail, not hold the suite
def test_rollway_run_with_rewards_hung_for_ever_records_all_and_exits(tmp_path: Path) -> None:
    workdir = tmp_path
    (workdir / "echo.py").write_text(AGENT_SOURCE)
    (workdir / "hang.py").write_text(HUNG_REWARD)
    rows = [{"task_id": f"t{i}", "question": f"q{i}"} for i in range(HUNG)]
    (workdir / "tasks.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    ran = subprocess.run(
        [sys.executable, "-m", "rollway", "run", "echo.py:Echo", "--tasks", "tasks.jsonl",
         "--engine", "sim", "--reward", "hang.py:hang", "--reward-timeout", "1",
         "--reward-retries", "0", "--timeout", "20", "--out", "runs", "--exp-id", "hung"],
        cwd=workdir, capture_output=True, text=True, timeout=120, env=_this_rollway(),
    )  # fmt: skip
    assert "Traceback" not in ran.stderr, ran.stderr
    records = [orjson.loads(p.read_bytes()) for p in (workdir / "runs/hung/trajectories").iterdir()]
    assert len(records) == HUNG, ran.stderr
    assert {(r["status"], r["error_kind"], r["reason"]) for r in records} == {
        ("error", "reward", "reward function timed out after 1 s")
    }
    summary = orjson.loads((workdir / "runs/hung/summary.json").read_bytes())
    assert summary["total"] == HUNG


def _this_rollway() -> dict[str, str]:
    """The environment for a ``rollway`` subprocess that imports this checkout's package,
    wherever its working folder is (a relative ``PYTHONPATH`` would not follow it)."""
    source = str(Path(rollway.__file__).resolve().parents[1])
    path = os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


@pytest.mark.timeout(120, method="thread")  # a child that lingered would hold waitpid
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_copy_of_the_client_a_reward_forks_ends_where_it_returns(
    make_client: MakeClient, kind: str
) -> None:
    children: list[int] = []

    def forking(task: dict[str, Any], trajectory: Trajectory) -> float:
        pid = os.fork()
        if pid == 0:
            return 0.0  # the child, a copy of this client, comes back into rollway
        children.append(pid)
        return 1.0

    async def forking_async(task: dict[str, Any], trajectory: Trajectory) -> float:
        return forking(task, trajectory)

    reward = forking if kind == "sync" else forking_async
    client = make_client(reward=reward, limits=QUICK)
    items = list(client.run_batch([{"task_id": "a"}, {"task_id": "b"}]))
    assert [item.result.reward for item in items] == [1.0, 1.0]
    assert len(children) == 2
    for child in children:  # each ended at once, with nothing of the batch run again
        assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0
    assert len(list(client.store.records())) == 2


def test_a_helper_a_reward_starts_is_its_own_to_end(make_client: MakeClient) -> None:
    helpers: list[subprocess.Popen[bytes]] = []

    def starts_a_helper(task: dict[str, Any], trajectory: Trajectory) -> float:
        helper = [sys.executable, "-c", "import time; time.sleep(120)"]
        quiet = subprocess.DEVNULL
        helpers.append(subprocess.Popen(helper, start_new_session=True, stdout=quiet, stderr=quiet))
        return 1.0

    client = make_client(reward=starts_a_helper, limits=QUICK)
    try:
        (item,) = client.run_batch([{"task_id": "a"}])
        client.close()
        assert item.result.reward == 1.0
        # As docs/agents.md says: rollway does not end what a reward starts itself.
        assert [helper.poll() for helper in helpers] == [None]
    finally:
        for helper in helpers:
            helper.kill()
            helper.wait(30)


@pytest.mark.timeout(120, method="thread")  # a hang must fail, not hold the suite
def test_a_rescore_with_graders_hung_for_ever_ends(
    make_client: MakeClient, release: threading.Event
) -> None:
    def hang(task: dict[str, Any], trajectory: Trajectory) -> float:
        release.wait()
        return 1.0

    client = make_client(reward=lambda task, trajectory: 0.5)
    assert all(
        item.success for item in client.run_batch([{"task_id": f"t{i}"} for i in range(HUNG)])
    )
    report = rollway.rescore(client.store, hang, limits=QUICK, concurrency=HUNG)
    assert (report.scored, report.failed) == (0, HUNG)
