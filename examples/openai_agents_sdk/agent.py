"""A program agent on a third-party framework: the OpenAI Agents SDK (``openai-agents``).

An ordinary Agents SDK program: an ``Agent`` with ``@function_tool`` tools, run by ``Runner``,
configured the SDK's usual way from ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``; it talks to
rollway's Responses API route like it would to OpenAI's. It reads the task from
``ROLLWAY_TASK_FILE`` and writes its answer and reward to ``ROLLWAY_RESULT_FILE``:

    pip install openai-agents
    rollway run --cmd "python examples/openai_agents_sdk/agent.py" \
        --tasks examples/calculator/tasks.jsonl --limit 4
"""

from __future__ import annotations

import asyncio
import json
import os
import re

from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
from agents.exceptions import AgentsException


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


@function_tool
def add(a: float, b: float) -> str:
    """Add two numbers."""
    return _number(a + b)


@function_tool
def subtract(a: float, b: float) -> str:
    """Subtract b from a."""
    return _number(a - b)


@function_tool
def multiply(a: float, b: float) -> str:
    """Multiply two numbers."""
    return _number(a * b)


# A worked example (Responses API input items) teaches a small model the call-then-answer
# pattern.
FEW_SHOT = [
    {"role": "user", "content": "What is 3 + 4?"},
    {"type": "function_call", "call_id": "call_0", "name": "add", "arguments": '{"a": 3, "b": 4}'},
    {"type": "function_call_output", "call_id": "call_0", "output": "7"},
    {"role": "assistant", "content": "The answer is 7."},
]


async def solve(question: str) -> str:
    agent = Agent(
        name="calculator",
        instructions="Use the tools to compute, then state the answer.",
        tools=[add, subtract, multiply],
        model=os.environ.get("OPENAI_MODEL", "gpt-4.1-mini"),
        model_settings=ModelSettings(max_tokens=48),
    )
    items = [*FEW_SHOT, {"role": "user", "content": question}]
    try:
        result = await Runner.run(agent, input=items, max_turns=4)
    except AgentsException as exc:  # too many turns, a malformed tool call, ...
        return f"no answer: {type(exc).__name__}"
    return str(result.final_output or "")


def main() -> None:
    set_tracing_disabled(True)  # this machine has no way to the tracing service
    with open(os.environ["ROLLWAY_TASK_FILE"]) as f:
        task = json.load(f)
    final = asyncio.run(solve(task["question"]))
    numbers = re.findall(r"-?\d+(?:\.\d+)?", final)
    correct = bool(numbers) and float(numbers[-1]) == float(task["answer"])
    with open(os.environ["ROLLWAY_RESULT_FILE"], "w") as f:
        json.dump({"final": final, "reward": 1.0 if correct else 0.0}, f)


if __name__ == "__main__":
    main()
