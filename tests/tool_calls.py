"""The tests' add tool and few-shot prefix: two worked calls that make the 135M embedded model
call tools. Tests' own data, not imported from the CLI: ``rollway demo`` sends the same
(tests/cli/test_demo_data.py holds the two together, so the demo keeps what these tests show
works)."""

from __future__ import annotations

import json

from openai.types.chat import (
    ChatCompletionMessageParam,
    ChatCompletionMessageToolCallParam,
    ChatCompletionToolParam,
)

ADD_TOOL: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


def tool_call(call_id: str, a: int, b: int) -> ChatCompletionMessageToolCallParam:
    arguments = json.dumps({"a": a, "b": b})
    return {"id": call_id, "type": "function", "function": {"name": "add", "arguments": arguments}}


FEW_SHOT: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is 3 + 4?"},
    {"role": "assistant", "content": None, "tool_calls": [tool_call("call_0", 3, 4)]},
    {"role": "user", "content": "What is 10 + 5?"},
    {"role": "assistant", "content": None, "tool_calls": [tool_call("call_1", 10, 5)]},
]
