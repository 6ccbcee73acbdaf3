"""The built-in agent: asks the model a task's question once and answers with what it said.
``rollway run`` uses it when no agent is named (a task source's rows, such as reasoning-gym's,
carry their question and their scorer: nothing else is needed)."""

from __future__ import annotations

from typing import Any

from rollway.agents.base import AgentLoop
from rollway.agents.context import RolloutContext
from rollway.results import AgentResult


class QuestionAgent(AgentLoop):
    """One model call on the task's ``messages``, else its ``prompt`` (messages or text),
    else its ``question``; the rollout's answer is the model's reply. No tools."""

    name = "question"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        messages = task_messages(ctx.task)
        if messages is None:
            return ctx.error("the task has no messages, prompt or question to ask")
        answer = await ctx.chat(messages)
        return ctx.complete([*messages, answer.message], answer.finish_reason)


def task_messages(task: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The conversation a task asks: ``messages``, ``prompt`` or ``question``; None if none."""
    for field in ("messages", "prompt", "question"):
        value = task.get(field)
        if isinstance(value, list) and value:
            return list(value)
        if isinstance(value, str) and value:
            return [{"role": "user", "content": value}]
    return None
