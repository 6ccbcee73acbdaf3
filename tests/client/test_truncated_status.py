"""One truncation truth: a rollout is truncated when a gateway limit ended it or its last turn
was cut (finish ``length``); its trajectory names why, its record is ``truncated`` with the
finish reason ``length`` where the agent said only the default ``stop``, and a turn cut before
the last, after which the rollout went on, leaves it completed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rollway.agents import AgentLoop, RolloutContext
from rollway.client import RolloutClient
from rollway.engines.sim import SimConfig
from rollway.results import AgentResult

MakeClient = Callable[..., RolloutClient]


class BudgetedAgent(AgentLoop):
    """One model call per entry of the task's ``max_tokens`` (None: the client's), then
    ``ctx.complete`` with the task's ``finish`` (the default ``stop`` where none)."""

    name = "budgeted"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
        for max_tokens in ctx.task["max_tokens"]:
            asked = {} if max_tokens is None else {"max_tokens": max_tokens}
            reply = await ctx.chat(messages, **asked)
            messages += [reply.message, {"role": "user", "content": "more"}]
        if "finish" in ctx.task:
            return ctx.complete(messages, finish_reason=ctx.task["finish"])
        return ctx.complete(messages)


def test_a_last_turn_cut_by_max_tokens_makes_the_record_truncated(
    make_client: MakeClient,
) -> None:
    client = make_client(SimConfig(output_len=16), max_tokens=4)
    record = client.invoke({"task_id": "t", "chats": 2}).result(30)
    trajectory = record.trajectory
    assert trajectory is not None
    assert [turn.finish_reason for turn in trajectory.turns] == ["length", "length"]
    assert trajectory.is_truncated and trajectory.truncation_reason == "max_tokens"
    assert record.status == "truncated" and record.finish_reason == "length"


def test_a_turn_cut_before_the_last_leaves_the_record_completed(make_client: MakeClient) -> None:
    client = make_client(SimConfig(output_len=16), agent=BudgetedAgent)
    record = client.invoke({"task_id": "t", "max_tokens": [4, None]}).result(30)
    trajectory = record.trajectory
    assert trajectory is not None
    assert [turn.finish_reason for turn in trajectory.turns] == ["length", "stop"]
    assert not trajectory.is_truncated and trajectory.truncation_reason is None
    assert record.status == "completed" and record.finish_reason == "stop"


def test_the_agents_own_finish_reason_is_kept_on_a_truncated_record(
    make_client: MakeClient,
) -> None:
    client = make_client(SimConfig(output_len=16), agent=BudgetedAgent)
    record = client.invoke({"task_id": "t", "max_tokens": [4], "finish": "max_steps"}).result(30)
    assert record.trajectory is not None and record.trajectory.truncation_reason == "max_tokens"
    assert record.status == "truncated" and record.finish_reason == "max_steps"


def test_a_gateway_limit_makes_the_record_truncated(make_client: MakeClient) -> None:
    client = make_client(max_turns=1)
    record = client.invoke({"task_id": "t", "chats": 2}).result(30)
    trajectory = record.trajectory
    assert trajectory is not None and len(trajectory.turns) == 1
    assert trajectory.turns[0].finish_reason == "stop"
    assert trajectory.is_truncated and trajectory.truncation_reason == "max_turns"
    assert record.status == "truncated" and record.finish_reason == "length"
