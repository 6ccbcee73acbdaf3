"""An agent for the outside re-test's agent server: one model call, then done."""

from __future__ import annotations

from typing import Any

from rollway import AgentLoop, AgentResult, RolloutContext


class OneCall(AgentLoop):
    name = "outsider-one-call"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
        reply = await ctx.chat(messages, max_tokens=8)
        messages.append(reply.message)
        return ctx.complete(messages)
