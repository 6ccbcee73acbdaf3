from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import Field

from rollway.agents import (
    AgentLoop,
    RolloutContext,
    execute_tool_calls,
    load_agent,
    register_agent,
    tool,
    validate,
)
from rollway.errors import AgentError, ConfigError
from rollway.types import AgentResult


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Longer text that is not part of the description.
    """
    return a + b


@tool(name="shout", description="Say it loudly.")
async def loud(text: Annotated[str, Field(description="What to say.")], times: int = 1) -> str:
    return text.upper() * times


@tool
def explode() -> str:
    """Always fails."""
    raise RuntimeError("boom")


class Good(AgentLoop):
    name = "good"
    tools = (add, loud)

    async def run(self, ctx: RolloutContext) -> AgentResult:
        return ctx.complete([])


def test_a_concrete_agent_without_a_name_fails_at_class_definition() -> None:
    with pytest.raises(TypeError, match="non-empty `name`"):

        class Nameless(AgentLoop):
            async def run(self, ctx: RolloutContext) -> AgentResult:
                return ctx.complete([])

    with pytest.raises(TypeError):

        class Blank(AgentLoop):
            name = "  "

            async def run(self, ctx: RolloutContext) -> AgentResult:
                return ctx.complete([])


def test_abstract_intermediates_need_no_name() -> None:
    class Base(AgentLoop):
        def helper(self) -> int:
            return 1

    class Concrete(Base):
        name = "concrete"

        async def run(self, ctx: RolloutContext) -> AgentResult:
            return ctx.complete([])

    assert Concrete().helper() == 1


def test_tool_schema_comes_from_type_hints_and_docstring() -> None:
    assert add.schema == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    }
    params = loud.schema["function"]["parameters"]
    assert loud.name == "shout" and loud.schema["function"]["description"] == "Say it loudly."
    assert params["required"] == ["text"]
    assert params["properties"]["text"]["description"] == "What to say."
    assert params["properties"]["times"]["default"] == 1
    assert add(2, 3) == 5  # still callable as the function


def test_tools_need_typed_named_parameters() -> None:
    with pytest.raises(AgentError, match="needs a type"):

        @tool
        def untyped(x) -> None:  # type: ignore[no-untyped-def]
            return None

    with pytest.raises(AgentError, match=r"\*args"):

        @tool
        def variadic(*xs: int) -> None:
            return None


def call(name: str, arguments: Any, call_id: str = "c") -> dict[str, Any]:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": raw}}


async def test_tool_failures_become_messages_the_model_can_read() -> None:
    message = {
        "role": "assistant",
        "tool_calls": [
            call("add", {"a": 1, "b": 2}, "ok"),
            call("shout", {"text": "hi", "times": 2}, "async"),
            call("nope", {}, "unknown"),
            call("add", "{not json", "badjson"),
            call("add", "[1, 2]", "notobject"),
            call("add", {"a": "x", "b": 2}, "invalid"),
            call("add", {"a": 1, "b": 2, "c": 3}, "extra"),
            call("explode", {}, "raises"),
        ],
    }
    latencies: list[float] = []
    replies = await execute_tool_calls(message, [add, loud, explode], latencies.append)
    by_id = {r["tool_call_id"]: r["content"] for r in replies}
    assert [r["tool_call_id"] for r in replies] == [c["id"] for c in message["tool_calls"]]
    assert all(r["role"] == "tool" for r in replies)
    assert by_id["ok"] == "3" and by_id["async"] == "HIHI"
    assert "unknown tool 'nope'" in by_id["unknown"] and "add" in by_id["unknown"]
    assert "not valid JSON" in by_id["badjson"]
    assert "must be a JSON object" in by_id["notobject"]
    assert "invalid arguments" in by_id["invalid"] and "a:" in by_id["invalid"]
    assert "c:" in by_id["extra"]
    assert by_id["raises"] == "error: explode raised RuntimeError: boom"
    assert len(latencies) == len(replies)


def codes(agent: Any) -> list[str]:
    return [issue.code for issue in validate(agent)]


def test_validate_returns_coded_errors_and_warnings() -> None:
    assert validate(Good) == [] and validate(Good()) == []

    class NotAsync(AgentLoop):
        name = "not-async"

        def run(self, ctx: RolloutContext) -> AgentResult:  # type: ignore[override]
            return ctx.complete([])

    class Raises(Good):
        name = "raises"

        def get_tools(self, task: dict[str, Any]) -> list[dict[str, Any]]:
            raise ValueError("no tools today")

    class NotList(Good):
        name = "not-list"

        def get_tools(self, task: dict[str, Any]) -> Any:
            return {"add": add.schema}

    class Malformed(Good):
        name = "malformed"

        def get_tools(self, task: dict[str, Any]) -> list[dict[str, Any]]:
            bad_params = {"type": "function", "function": {"name": "x", "parameters": []}}
            return [{"name": "bare"}, bad_params, add.schema, add.schema]

    class Undescribed(Good):
        name = "undescribed"

        def get_tools(self, task: dict[str, Any]) -> list[dict[str, Any]]:
            return [{"type": "function", "function": {"name": "x"}}]

    assert codes(int) == ["E100"]
    assert codes(NotAsync) == ["E103"]
    assert codes(Raises) == ["E201"]
    assert codes(NotList) == ["E202"]
    assert codes(Malformed) == ["E203", "E203", "E204"]
    assert [(i.code, i.severity) for i in validate(Undescribed)] == [("W201", "warning")]


def test_agents_load_by_module_path_file_path_and_registered_name(tmp_path: Path) -> None:
    assert load_agent("tests.agents.test_sdk:Good") is Good
    source = tmp_path / "my_agent.py"
    source.write_text(
        "from rollway.agents import AgentLoop\n"
        "class FileAgent(AgentLoop):\n"
        "    name = 'from-file'\n"
        "    async def run(self, ctx):\n"
        "        return ctx.complete([])\n"
    )
    loaded = load_agent(f"{source}:FileAgent")
    assert loaded.name == "from-file"
    register_agent(loaded)
    assert load_agent("from-file") is loaded
    with pytest.raises(ConfigError, match="already taken"):
        register_agent(type("Other", (loaded,), {"name": "from-file"}))
    with pytest.raises(ConfigError, match="not an AgentLoop"):
        load_agent("tests.agents.test_sdk:add")
    with pytest.raises(ConfigError, match="cannot import"):
        load_agent("no_such_module_here:Agent")
    with pytest.raises(ConfigError, match="module:Class"):
        load_agent("unregistered-name")
