"""What an in-process agent ends with is on its record: the final messages and finish reason it
passed, or the gateway's conversation when it passed none; and the run's wall time."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from typing import Any, ClassVar

from rollway.agents import AgentLoop, RolloutContext
from rollway.client import RolloutClient
from rollway.results import AgentResult

MakeClient = Callable[..., RolloutClient]


class EndingAgent(AgentLoop):
    """``chats`` model calls, ``sleep`` seconds, then ends as the task says; keeps a copy of
    the messages it passed."""

    name = "ending"
    passed: ClassVar[dict[str, list[dict[str, Any]]]] = {}

    async def run(self, ctx: RolloutContext) -> AgentResult:
        task = ctx.task
        messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
        for _ in range(task.get("chats", 2)):
            reply = await ctx.chat(messages)
            messages += [reply.message, {"role": "user", "content": "go on"}]
        await asyncio.sleep(task.get("sleep", 0))
        type(self).passed[task["task_id"]] = copy.deepcopy(messages)
        if task.get("end") == "error":
            return ctx.error("gave up", messages)
        return ctx.complete(messages, finish_reason=task.get("finish_reason", "stop"))


def test_the_messages_and_finish_reason_the_agent_passed_are_recorded_and_stored(
    make_client: MakeClient,
) -> None:
    client = make_client(agent=EndingAgent)
    tasks = [
        {"task_id": "capped", "finish_reason": "max_steps"},
        {"task_id": "gave-up", "end": "error"},
    ]
    records = {item.result.task["task_id"]: item.result for item in client.run_batch(tasks)}
    capped, gave_up = records["capped"], records["gave-up"]
    assert (capped.status, capped.finish_reason) == ("completed", "max_steps")
    assert capped.messages == EndingAgent.passed["capped"] and len(capped.messages) == 5
    assert capped.messages != capped.trajectory.messages  # the agent's, with its last message
    assert (gave_up.status, gave_up.error_kind, gave_up.finish_reason) == (
        "error",
        "agent",
        "error",
    )
    assert gave_up.messages == EndingAgent.passed["gave-up"]
    stored = {r.task["task_id"]: r for r in client.store.records()}
    assert stored["capped"].messages == capped.messages
    assert stored["capped"].finish_reason == "max_steps"


def test_a_rollout_that_returned_nothing_keeps_the_gateways_conversation(
    make_client: MakeClient,
) -> None:
    client = make_client(agent=EndingAgent, timeout=0.5)
    record = client.invoke({"task_id": "slow", "sleep": 30}).result(30)
    assert record.status == "timeout" and record.finish_reason is None
    assert record.messages == record.trajectory.messages and len(record.messages) == 4
    assert record.metrics.total_latency_ms >= 500


def test_metrics_hold_the_agents_wall_time_around_its_model_calls(
    make_client: MakeClient,
) -> None:
    client = make_client(agent=EndingAgent)
    record = client.invoke({"task_id": "timed", "sleep": 0.2}).result(30)
    metrics = record.metrics
    assert record.status == "completed" and metrics.llm_calls == 2
    assert metrics.llm_latency_ms > 0
    assert metrics.total_latency_ms >= 200 + metrics.llm_latency_ms
    assert metrics.total_latency_ms <= record.elapsed_s * 1000
