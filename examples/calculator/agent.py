"""A calculator agent: the model answers arithmetic questions with four tools.

Run it:  rollway run examples/calculator/agent.py:CalculatorAgent \
             --tasks examples/calculator/tasks.jsonl --group-size 2 --limit 8
"""

from __future__ import annotations

import json
import re
from typing import Any

from rollway.agents import AgentLoop, RolloutContext, execute_tool_calls, tool
from rollway.results import AgentResult


def format_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


@tool
def add(a: float, b: float) -> str:
    """Add two numbers."""
    return format_number(a + b)


@tool
def subtract(a: float, b: float) -> str:
    """Subtract b from a."""
    return format_number(a - b)


@tool
def multiply(a: float, b: float) -> str:
    """Multiply two numbers."""
    return format_number(a * b)


@tool
def divide(a: float, b: float) -> str:
    """Divide a by b."""
    return format_number(a / b)


def _call(call_id: str, name: str, a: int, b: int) -> dict[str, Any]:
    arguments = json.dumps({"a": a, "b": b})
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# Worked examples: a 135M model learns the call-then-answer pattern from them.
FEW_SHOT: list[dict[str, Any]] = [
    {"role": "user", "content": "What is 3 + 4?"},
    {"role": "assistant", "content": None, "tool_calls": [_call("call_0", "add", 3, 4)]},
    {"role": "tool", "tool_call_id": "call_0", "content": "7"},
    {"role": "assistant", "content": "The answer is 7."},
    {"role": "user", "content": "What is 6 * 5?"},
    {"role": "assistant", "content": None, "tool_calls": [_call("call_1", "multiply", 6, 5)]},
    {"role": "tool", "tool_call_id": "call_1", "content": "30"},
    {"role": "assistant", "content": "The answer is 30."},
]


def check_answer(task: dict[str, Any], text: str | None) -> bool:
    """True when the last number in ``text`` equals the task's answer."""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", text or "")
    return bool(numbers) and float(numbers[-1]) == float(task["answer"])


class CalculatorAgent(AgentLoop):
    name = "calculator"
    tools = (add, subtract, multiply, divide)
    max_steps = 4

    async def run(self, ctx: RolloutContext) -> AgentResult:
        messages = [*FEW_SHOT, {"role": "user", "content": ctx.task["question"]}]
        for _ in range(self.max_steps):
            reply = await ctx.chat(messages, max_tokens=48)
            messages.append(reply.message)
            if not reply.tool_calls:
                reward = 1.0 if check_answer(ctx.task, reply.content) else 0.0
                return ctx.complete(messages, reply.finish_reason, reward=reward)
            messages += await execute_tool_calls(reply.message, self.tools, ctx.record_tool_call)
        return ctx.complete(messages, "max_steps", reward=0.0)


def reward(task: dict[str, Any], trajectory: Any) -> dict[str, Any]:
    """The same check as a reward function, for `rollway run --reward`."""
    final = next(
        (m.get("content") for m in reversed(trajectory.messages) if m["role"] == "assistant"), None
    )
    return {"reward": 1.0 if check_answer(task, final) else 0.0, "final": final}
