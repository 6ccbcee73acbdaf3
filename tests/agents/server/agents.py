"""Agents for agent-server tests; the task says what to do (importable by a subprocess too)."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from rollway.agents import AgentLoop, RolloutContext, tool
from rollway.generation import ChatResult
from rollway.results import AgentResult


@tool
def echo(text: str) -> str:
    """Repeat the text."""
    return text


@tool
def shout(text: str) -> str:
    """Repeat the text loudly."""
    return text.upper()


class TaskDrivenAgent(AgentLoop):
    """``sleep`` seconds, ``chats`` model calls, then ``end`` (complete | error | raise); a
    completed run ends with the task's ``finish_reason`` (default ``stop``)."""

    name = "task-driven"
    tools = (echo, shout)
    started: ClassVar[list[str]] = []
    #: What ``ctx.chat`` answered, by rollout id.
    answers: ClassVar[dict[str, list[ChatResult]]] = {}

    async def run(self, ctx: RolloutContext) -> AgentResult:
        type(self).started.append(ctx.rollout_id)
        task = ctx.task
        await asyncio.sleep(task.get("sleep", 0))
        messages: list[dict[str, Any]] = [{"role": "user", "content": task.get("q", "hi")}]
        for _ in range(task.get("chats", 0)):
            reply = await ctx.chat(messages)
            type(self).answers.setdefault(ctx.rollout_id, []).append(reply)
            messages += [reply.message, {"role": "user", "content": "again"}]
        end = task.get("end", "complete")
        if end == "raise":
            raise ValueError("agent bug")
        if end == "error":
            return ctx.error("gave up", messages)
        finish_reason = task.get("finish_reason", "stop")
        return ctx.complete(messages, finish_reason=finish_reason, reward=task.get("reward"))


class NamelessTools(AgentLoop):
    """Invalid: its tool schema has no function name."""

    name = "broken-tools"

    def get_tools(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"type": "function", "function": {"parameters": {"type": "object"}}}]

    async def run(self, ctx: RolloutContext) -> AgentResult:
        return ctx.complete([])
