"""A program agent written with the official openai SDK: a calculator tool loop.

rollway runs it once per rollout with OPENAI_BASE_URL / OPENAI_API_KEY / OPENAI_MODEL pointing
at the rollout's gateway and the task in ROLLWAY_TASK_FILE; it writes its final answer and
reward to ROLLWAY_RESULT_FILE. Nothing in it knows about rollway:

    rollway run --cmd "python examples/openai_agent/agent.py" \
        --tasks examples/calculator/tasks.jsonl --limit 4
"""

from __future__ import annotations

import json
import os
import re

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.capitalize()} two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    }
    for name in ("add", "subtract", "multiply")
]
OPERATIONS = {
    "add": lambda a, b: a + b,
    "subtract": lambda a, b: a - b,
    "multiply": lambda a, b: a * b,
}


def call(call_id: str, name: str, a: int, b: int) -> dict:
    arguments = json.dumps({"a": a, "b": b})
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# Worked examples teach a small model the call-then-answer pattern.
FEW_SHOT = [
    {"role": "user", "content": "What is 3 + 4?"},
    {"role": "assistant", "content": None, "tool_calls": [call("call_0", "add", 3, 4)]},
    {"role": "tool", "tool_call_id": "call_0", "content": "7"},
    {"role": "assistant", "content": "The answer is 7."},
]


def run_tool(name: str, arguments: str) -> str:
    try:
        args = json.loads(arguments)
        value = OPERATIONS[name](float(args["a"]), float(args["b"]))
    except (KeyError, ValueError, TypeError) as exc:
        return f"error: {exc}"
    return str(int(value)) if value.is_integer() else str(value)


def main() -> None:
    with open(os.environ["ROLLWAY_TASK_FILE"]) as f:
        task = json.load(f)
    client = OpenAI()  # reads OPENAI_BASE_URL and OPENAI_API_KEY
    messages = [*FEW_SHOT, {"role": "user", "content": task["question"]}]
    final = ""
    for _ in range(4):
        reply = client.chat.completions.create(
            model=os.environ["OPENAI_MODEL"], messages=messages, tools=TOOLS, max_tokens=48
        )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            final = message.content or ""
            break
        for tool_call in message.tool_calls:
            output = run_tool(tool_call.function.name, tool_call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": output})
    numbers = re.findall(r"-?\d+(?:\.\d+)?", final)
    correct = bool(numbers) and float(numbers[-1]) == float(task["answer"])
    with open(os.environ["ROLLWAY_RESULT_FILE"], "w") as f:
        json.dump({"final": final, "reward": 1.0 if correct else 0.0}, f)


if __name__ == "__main__":
    main()
