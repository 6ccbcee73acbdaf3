"""An agent's mistake in what it returns, or a reward function's NaN, is recorded as that
rollout's error; it never loses the record nor breaks the batch around it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sys
from collections.abc import Callable
from typing import Any

import pytest

from rollway.agents import AgentLoop, RolloutContext
from rollway.client import RolloutClient
from rollway.errors import InvalidFieldsError
from rollway.generation import SamplingParams
from rollway.results import AgentResult
from rollway.trajectory import Trajectory

MakeClient = Callable[..., RolloutClient]

BAD_ENDINGS: dict[str, Any] = {
    "finish-not-text": lambda ctx: ctx.complete([], finish_reason=123),
    "messages-not-list": lambda ctx: ctx.complete("hello"),
    "messages-not-dicts": lambda ctx: ctx.complete(["hello"]),
    "nan-reward": lambda ctx: ctx.complete([], reward=math.nan),
    "bool-reward": lambda ctx: ctx.complete([], reward=True),
}


class BadEnding(AgentLoop):
    name = "bad-ending"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        await ctx.chat([{"role": "user", "content": "hi"}])
        ending = BAD_ENDINGS.get(ctx.task.get("ending", ""))
        return ending(ctx) if ending else ctx.complete([])


def test_invalid_results_are_the_agents_error_and_the_batch_goes_on(
    make_client: MakeClient,
) -> None:
    client = make_client(agent=BadEnding, max_retry_attempts=1)
    tasks = [{"task_id": name, "ending": name} for name in BAD_ENDINGS] + [{"task_id": "fine"}]
    records = {item.result.task["task_id"]: item.result for item in client.run_batch(tasks)}
    assert records.pop("fine").status == "completed"
    assert set(records) == set(BAD_ENDINGS)
    for name, record in records.items():
        assert (record.status, record.error_kind) == ("error", "agent"), name
        assert "run returned an invalid result" in (record.reason or ""), name
        stored = client.store.get(record.rollout_key)
        assert stored is not None and stored.status == "error", name


def nan_reward(task: dict[str, Any], trajectory: Trajectory) -> float:
    return math.nan if task["task_id"] == "nan" else 1.0


def test_a_nan_reward_is_a_reward_error_and_the_summary_still_adds_up(
    make_client: MakeClient,
) -> None:
    client = make_client(agent=BadEnding, reward=nan_reward, max_retry_attempts=1)
    items = list(client.run_batch([{"task_id": "nan"}, {"task_id": "ok"}], group_size=2))
    by_task = {}
    for item in items:
        by_task.setdefault(item.result.task["task_id"], []).append(item.result)
    assert all(r.error_kind == "reward" and "finite" in (r.reason or "") for r in by_task["nan"])
    assert all(r.reward == 1.0 for r in by_task["ok"])
    summary = json.loads((client.store.path / "summary.json").read_text())
    assert summary["mean_reward"] == 1.0


class Exiting(AgentLoop):
    """Calls ``sys.exit()`` where the task says: in ``run``, or in ``stop`` (then it hangs)."""

    name = "exiting"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        await ctx.chat([{"role": "user", "content": "hi"}])
        if ctx.task.get("exit") == "run":
            raise SystemExit(2)
        if ctx.task.get("exit") == "stop":
            await asyncio.Event().wait()
        return ctx.complete([])

    async def stop(self, ctx: RolloutContext) -> None:
        if ctx.task.get("exit") == "stop":
            sys.exit(5)


def exiting_reward(task: dict[str, Any], trajectory: Trajectory) -> float:
    if task["exit"] == "reward":
        sys.exit(3)
    return 1.0


def interrupting_reward(task: dict[str, Any], trajectory: Trajectory) -> float:
    if task["exit"] == "reward":
        raise KeyboardInterrupt  # not a Ctrl-C: raised on a worker thread, the scorer's own
    return 1.0


async def interrupting_async_reward(task: dict[str, Any], trajectory: Trajectory) -> float:
    if task["exit"] == "reward":
        raise KeyboardInterrupt  # on the client's loop thread: no Ctrl-C lands there
    return 1.0


@pytest.mark.timeout(60)  # the defect killed the client's loop thread: the batch hung
@pytest.mark.parametrize("reward", [interrupting_reward, interrupting_async_reward])
def test_a_keyboard_interrupt_raised_by_a_reward_function_is_a_reward_error(
    make_client: MakeClient, reward: Callable[..., Any]
) -> None:
    client = make_client(agent=Exiting, reward=reward, max_retry_attempts=1, timeout=5.0)
    items = list(client.run_batch([{"task_id": n, "exit": n} for n in ("reward", "none")]))
    records = {item.result.task["task_id"]: item.result for item in items}
    scored = records["reward"]
    assert (scored.status, scored.error_kind) == ("error", "reward")
    assert "reward function raised KeyboardInterrupt" in (scored.reason or "")
    assert records["none"].reward == 1.0


async def exiting_async_reward(task: dict[str, Any], trajectory: Trajectory) -> float:
    if task["exit"] == "reward":
        raise SystemExit(3)
    return 1.0


@pytest.mark.timeout(60)  # the defect hung the batch (and its client's close) for good
@pytest.mark.parametrize("reward", [exiting_reward, exiting_async_reward])
def test_sys_exit_in_user_code_is_that_rollouts_error_and_the_batch_ends(
    make_client: MakeClient, reward: Callable[..., Any]
) -> None:
    client = make_client(agent=Exiting, reward=reward, max_retry_attempts=1, timeout=1.0)
    exits = ["run", "stop", "reward", "none"]
    items = list(client.run_batch([{"task_id": name, "exit": name} for name in exits]))
    records = {item.result.task["task_id"]: item.result for item in items}
    assert sorted(records) == sorted(exits)
    run = records["run"]
    assert (run.status, run.error_kind) == ("error", "agent")
    assert "SystemExit: 2" in (run.reason or "")
    stop = records["stop"]
    assert stop.status == "timeout"
    assert any("SystemExit: 5" in error for error in stop.cleanup_errors)
    scored = records["reward"]
    assert (scored.status, scored.error_kind) == ("error", "reward")
    assert "reward function raised SystemExit: 3" in (scored.reason or "")
    assert records["none"].reward == 1.0
    assert (client.store.path / "summary.json").exists()


@pytest.mark.parametrize(
    ("given", "stop"),
    [("</answer>", ("</answer>",)), (["a", "bc"], ("a", "bc")), ((), ())],
)
def test_one_stop_string_is_one_stop_string(given: Any, stop: tuple[str, ...]) -> None:
    assert SamplingParams(stop=given).stop == stop


def test_stop_ids_take_one_id_or_several_and_nothing_else() -> None:
    assert SamplingParams(stop_token_ids=5).stop_token_ids == (5,)
    assert SamplingParams(stop_token_ids=[5, 6]).stop_token_ids == (5, 6)
    with pytest.raises(InvalidFieldsError, match="stop_token_ids"):
        SamplingParams(stop_token_ids=["5"])  # type: ignore[list-item]
    with pytest.raises(InvalidFieldsError, match="stop"):
        SamplingParams(stop=5)  # type: ignore[arg-type]


def test_a_client_named_by_a_free_text_agent_name_gets_a_valid_experiment_id(
    make_client: MakeClient,
) -> None:
    class Spacey(BadEnding):
        name = "My Agent: v2"

    client = make_client(agent=Spacey)
    assert client.exp_id == "My-Agent-v2"
    assert client.invoke({"task_id": "t"}).result(30).status == "completed"


class CancelRaising(AgentLoop):
    """Raises ``asyncio.CancelledError`` itself where the task says: in ``run``, or in ``stop``
    (then it hangs until stopped). Nothing cancelled it."""

    name = "cancel-raising"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        await ctx.chat([{"role": "user", "content": "hi"}])
        if ctx.task.get("raise") == "run":
            raise asyncio.CancelledError("the agent's own")
        if ctx.task.get("raise") == "stop":
            await asyncio.Event().wait()
        return ctx.complete([])

    async def stop(self, ctx: RolloutContext) -> None:
        if ctx.task.get("raise") == "stop":
            raise asyncio.CancelledError("stop's own")


def cancel_raising_reward(task: dict[str, Any], trajectory: Trajectory) -> float:
    if task["raise"] == "reward":
        raise asyncio.CancelledError("the scorer's own")  # on a worker thread
    return 1.0


async def cancel_raising_async_reward(task: dict[str, Any], trajectory: Trajectory) -> float:
    if task["raise"] == "reward":
        raise asyncio.CancelledError("the scorer's own")  # on the client's loop
    return 1.0


@pytest.mark.timeout(60)  # the defect raised out of run_batch, leaving the rest pending
@pytest.mark.parametrize("reward", [cancel_raising_reward, cancel_raising_async_reward])
def test_a_cancelled_error_raised_by_user_code_is_that_rollouts_error(
    make_client: MakeClient, reward: Callable[..., Any]
) -> None:
    client = make_client(agent=CancelRaising, reward=reward, max_retry_attempts=1, timeout=1.0)
    raises = ["run", "stop", "reward", "none"]
    items = list(client.run_batch([{"task_id": name, "raise": name} for name in raises]))
    records = {item.result.task["task_id"]: item.result for item in items}
    assert sorted(records) == sorted(raises)
    run = records["run"]
    assert (run.status, run.error_kind) == ("error", "agent")
    assert "CancelledError: the agent's own" in (run.reason or "")
    stop = records["stop"]
    assert stop.status == "timeout"
    assert any("CancelledError: stop's own" in error for error in stop.cleanup_errors)
    scored = records["reward"]
    assert (scored.status, scored.error_kind) == ("error", "reward")
    assert "reward function raised CancelledError: the scorer's own" in (scored.reason or "")
    assert records["none"].reward == 1.0
    summary = json.loads((client.store.path / "summary.json").read_text())
    assert summary["total"] == 4


@pytest.mark.timeout(60)
async def test_cancelling_the_batch_itself_still_cancels_it(make_client: MakeClient) -> None:
    running = asyncio.Event()
    loop = asyncio.get_running_loop()
    client = make_client(
        agent=CancelRaising,
        timeout=30.0,
        on_event=lambda _: loop.call_soon_threadsafe(running.set),
    )

    async def consume() -> None:
        async for _ in client.run_batch_async([{"task_id": "a", "raise": "stop"}]):
            pass

    task = asyncio.create_task(consume())
    await asyncio.wait_for(running.wait(), 30)  # the rollout started: it hangs until stopped
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    record = client.store.get("a.0")
    assert record is not None and record.status == "cancelled"


class Unstoppable(AgentLoop):
    """Misbehaves where the task says once its time is up: ``stop()`` never returns, or
    ``run`` catches its cancellation and carries on; ``slow`` takes a moment, then ends."""

    name = "unstoppable"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        await ctx.chat([{"role": "user", "content": "hi"}])
        if ctx.task["how"] == "swallow":
            while True:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(1)
        if ctx.task["how"] == "stop-hangs":
            await asyncio.Event().wait()
        if ctx.task["how"] == "slow":
            await asyncio.sleep(1)
        return ctx.complete([])

    async def stop(self, ctx: RolloutContext) -> None:
        if ctx.task["how"] == "stop-hangs":
            await asyncio.Event().wait()


async def self_cancelling_reward(task: dict[str, Any], trajectory: Trajectory) -> float:
    if task["how"] == "reward-cancels":
        task_running = asyncio.current_task()
        assert task_running is not None
        task_running.cancel()
        await asyncio.sleep(0)
    return 1.0


@pytest.mark.timeout(60)  # the defect raised CancelledError out of run_batch
def test_a_reward_that_cancels_its_own_task_is_that_rollouts_reward_error(
    make_client: MakeClient,
) -> None:
    client = make_client(agent=Unstoppable, reward=self_cancelling_reward, reward_retries=0)
    tasks = [{"task_id": "cancels", "how": "reward-cancels"}, {"task_id": "slow", "how": "slow"}]
    records = {item.result.task["task_id"]: item.result for item in client.run_batch(tasks)}
    assert sorted(records) == ["cancels", "slow"]
    scored = records["cancels"]
    assert (scored.status, scored.error_kind) == ("error", "reward")
    assert "reward function cancelled its own task" in (scored.reason or "")
    assert records["slow"].reward == 1.0
    stored = client.store.get("cancels.0")
    assert stored is not None and stored.error_kind == "reward"


@pytest.mark.timeout(60)  # the defect waited for stop() for good
def test_a_stop_that_never_returns_is_bounded_by_the_grace_period(
    make_client: MakeClient,
) -> None:
    client = make_client(agent=Unstoppable, timeout=1.0, stop_grace_s=0.5)
    (item,) = client.run_batch([{"task_id": "hangs", "how": "stop-hangs"}])
    record = item.result
    assert record.status == "timeout"
    assert "stop: TimeoutError: stop() did not return within 0.5 s" in record.cleanup_errors
    assert record.elapsed_s < 1.0 + 2 * 0.5 + 5.0  # the timeout, the two graces, slack


@pytest.mark.timeout(60)  # the defect waited for the agent's task for good
def test_an_agent_that_ignores_its_cancellation_is_abandoned_and_its_rollout_recorded(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    client = make_client(agent=Unstoppable, timeout=1.0, stop_grace_s=0.5)
    tasks = [{"task_id": "swallows", "how": "swallow"}, {"task_id": "fine", "how": "none"}]
    records = {item.result.task["task_id"]: item.result for item in client.run_batch(tasks)}
    swallowed = records["swallows"]
    assert swallowed.status == "timeout"
    assert swallowed.reason is not None
    assert swallowed.reason.startswith("timed out after 1 s")
    assert "the agent ignored its cancellation for 0.5 s" in swallowed.reason
    assert swallowed.elapsed_s < 1.0 + 2 * 0.5 + 5.0
    assert records["fine"].status == "completed"
    warned = [m for m in caplog.messages if "ignored its cancellation" in m]
    assert len(warned) == 1 and "swallows" in warned[0]


@pytest.mark.timeout(60)  # the defect raised CancelledError out of run_batch
def test_a_cancelled_error_that_slips_out_of_a_rollout_is_recorded_as_its_error(
    make_client: MakeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stands in for any user code whose own CancelledError would end the rollout's task.
    client = make_client(agent=Unstoppable)
    admit = client._admission.run

    async def slipping(spec: Any, settings: Any, cancel: asyncio.Event) -> Any:
        if spec.task["task_id"] == "stray":
            raise asyncio.CancelledError("slipped through")
        return await admit(spec, settings, cancel)

    monkeypatch.setattr(client._admission, "run", slipping)
    tasks = [{"task_id": "stray", "how": "none"}, {"task_id": "fine", "how": "slow"}]
    records = {item.result.task["task_id"]: item.result for item in client.run_batch(tasks)}
    assert sorted(records) == ["fine", "stray"]
    stray = records["stray"]
    assert (stray.status, stray.error_kind) == ("error", "agent")
    assert "raised asyncio.CancelledError though nothing cancelled it" in (stray.reason or "")
    assert records["fine"].status == "completed"
    stored = client.store.get("stray.0")
    assert stored is not None and stored.status == "error"
