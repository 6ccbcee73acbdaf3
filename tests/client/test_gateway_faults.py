"""A shared gateway (``RemoteGateway``) that dies or restarts while rollouts run or clean up:
every rollout still ends with exactly one record, a ``completed`` record always carries its
trajectory, and what the gateway lost is an infrastructure error, retried under a new attempt
id and rerun by resume."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rollway.agents import AgentLoop, RolloutContext
from rollway.client import RolloutClient
from rollway.engines.sim import SimConfig, SimEngine
from rollway.gateway import Gateway, create_app
from rollway.gateway.remote_gateway import RemoteGateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.results import AgentResult, RolloutRecord
from tests.restartable import RestartableServer

ROLLOUTS = 4


class ShakyGateway(RestartableServer):
    """A ``rollway gateway`` app (sim engine) on a fixed loopback port. ``restart`` serves a
    fresh gateway on the same port: it knows none of the old rollouts, as after a real one."""

    def __init__(self, renderer: ChatRenderer) -> None:
        self.renderer = renderer
        self.admin_key = f"ak-{secrets.token_hex(8)}"
        self.gateway: Gateway  # the one serving now
        super().__init__()

    def make_app(self) -> Any:
        self.gateway = Gateway(SimEngine(SimConfig()), self.renderer, model_name="sim")
        return create_app(self.gateway, admin_key=self.admin_key, close_engine=False)


@pytest.fixture
def shaky(renderer: ChatRenderer) -> Iterator[ShakyGateway]:
    gateway = ShakyGateway(renderer)
    yield gateway
    gateway.stop()


class FaultAgent(AgentLoop):
    """Chats once; on their first attempt all ``ROLLOUTS`` rollouts meet, the last one in sets
    off ``fault`` (in a thread: it stops or restarts the gateway), then each goes on: ``chats``
    more calls, or ``hang`` until stopped, then completes."""

    name = "fault"

    def __init__(self, fault: Callable[[], None] | None = None) -> None:
        self.fault = fault
        self.waiting = 0
        self.released: asyncio.Event | None = None
        self.stopped = 0

    async def run(self, ctx: RolloutContext) -> AgentResult:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
        reply = await ctx.chat(messages)
        messages += [reply.message, {"role": "user", "content": "more"}]
        if self.fault is not None:
            await self._meet_the_fault()
            if ctx.task.get("hang"):
                try:
                    await asyncio.sleep(60)
                finally:
                    self.stopped += 1
        for _ in range(ctx.task.get("chats", 0)):
            reply = await ctx.chat(messages)
            messages += [reply.message, {"role": "user", "content": "more"}]
        return ctx.complete(messages, reward=1.0)

    async def _meet_the_fault(self) -> None:
        if self.released is None:
            self.released = asyncio.Event()
        self.waiting += 1
        if self.waiting < ROLLOUTS:
            await self.released.wait()
            return
        fault, self.fault = self.fault, None  # later attempts run undisturbed
        assert fault is not None
        await asyncio.to_thread(fault)
        self.released.set()


def run_client(
    shaky: ShakyGateway, agent: FaultAgent, tmp_path: Path, tasks: list[dict[str, Any]], **kw: Any
) -> tuple[RolloutClient, list[RolloutRecord]]:
    gateway = RemoteGateway(shaky.url, admin_key=shaky.admin_key)
    kw.setdefault("max_concurrent", ROLLOUTS)
    client = RolloutClient(agent, gateway, store=str(tmp_path), exp_id="faults", **kw)
    return client, [item.result for item in client.run_batch(tasks)]


def check_one_record_each(client: RolloutClient, records: list[RolloutRecord]) -> None:
    """Exactly one record per submitted rollout, in the store too; none completed without
    its trajectory, and each record's id is its last attempt's."""
    keys = sorted(r.rollout_key for r in records)
    assert keys == [f"t{i}.0" for i in range(ROLLOUTS)]
    assert sorted(r.rollout_key for r in client.store.records()) == keys
    for record in records:
        assert record.rollout_id == f"faults.{record.rollout_key}.{record.attempts}"
        if record.status == "completed":
            assert record.trajectory is not None, record
            assert record.trajectory.rollout_id == record.rollout_id
            assert len(record.trajectory.turns) >= 1 and record.reward == 1.0


def tasks(**fields: Any) -> list[dict[str, Any]]:
    return [{"task_id": f"t{i}", **fields} for i in range(ROLLOUTS)]


def test_a_gateway_restart_during_cleanup_is_retried_never_completed_without_trajectory(
    shaky: ShakyGateway, tmp_path: Path
) -> None:
    agent = FaultAgent(fault=shaky.restart)
    client, records = run_client(shaky, agent, tmp_path, tasks())
    with client:
        check_one_record_each(client, records)
        for record in records:
            assert record.status == "completed", (record.status, record.reason)
            assert record.attempts >= 2  # the first attempt's recording was lost
        assert shaky.gateway._rollouts == {}  # the retries were unregistered too


def test_a_rollout_unknown_to_a_restarted_gateway_is_an_infrastructure_error(
    shaky: ShakyGateway, tmp_path: Path
) -> None:
    agent = FaultAgent(fault=shaky.restart)
    client, records = run_client(shaky, agent, tmp_path, tasks(chats=1), max_retry_attempts=1)
    with client:
        check_one_record_each(client, records)
        for record in records:
            assert (record.status, record.error_kind) == ("error", "infrastructure")
            assert "UnknownRolloutError" in (record.reason or ""), record.reason
    agent = FaultAgent(fault=shaky.restart)
    client, records = run_client(shaky, agent, tmp_path / "retried", tasks(chats=1))
    with client:
        check_one_record_each(client, records)
        for record in records:
            assert record.status == "completed" and record.attempts >= 2, record.reason
            assert record.trajectory is not None and len(record.trajectory.turns) == 2
        assert shaky.gateway._rollouts == {}


def test_a_gateway_that_dies_during_cleanup_leaves_errors_that_resume_reruns(
    shaky: ShakyGateway, tmp_path: Path
) -> None:
    # Down for longer than the rollouts' timeout: they wait that long for it, then give up.
    agent = FaultAgent(fault=shaky.stop)
    client, records = run_client(shaky, agent, tmp_path, tasks(), max_retry_attempts=2, timeout=1.0)
    with client:
        check_one_record_each(client, records)
        for record in records:
            assert (record.status, record.error_kind) == ("error", "infrastructure")
            assert record.reason is not None and record.reason.startswith(
                f"the shared gateway at {shaky.url} was down for"
            ), record.reason
            # The attempt the outage ended was not counted: no second one ran against it.
            assert record.attempts == 1 and record.trajectory is None
            assert record.reward is None
        assert client.last_summary is not None
        assert client.last_summary["by_status"] == {"error": ROLLOUTS}
        shaky.start()
        rerun = list(client.run_batch(tasks()))
        assert not any(item.from_store for item in rerun)
        check_one_record_each(client, [item.result for item in rerun])
        assert all(item.result.status == "completed" for item in rerun)


def test_a_timeout_while_the_gateway_is_down_still_stops_the_agent(
    shaky: ShakyGateway, tmp_path: Path
) -> None:
    agent = FaultAgent(fault=shaky.stop)
    client, records = run_client(
        shaky, agent, tmp_path, tasks(hang=True), max_retry_attempts=1, timeout=1.0,
        stop_grace_s=0.2,
    )  # fmt: skip
    with client:
        check_one_record_each(client, records)
        assert agent.stopped == ROLLOUTS
        for record in records:
            assert (record.status, record.error_kind) == ("error", "infrastructure")
            assert any(e.startswith("abort:") for e in record.cleanup_errors), record
