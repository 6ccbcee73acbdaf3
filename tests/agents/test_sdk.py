from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import Field

from rollway.agents import (
    AgentLoop,
    IssueCode,
    RolloutContext,
    execute_tool_calls,
    list_agents,
    load_agent,
    register_agent,
    tool,
    unregister_agent,
    validate,
)
from rollway.agents.tools import DEFERRED_PROBLEMS, Tool
from rollway.agents.validate import ready_agent
from rollway.errors import AgentError, ConfigError
from rollway.results import AgentResult


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
    calls: list[tuple[float, str]] = []
    replies = await execute_tool_calls(
        message, [add, loud, explode], lambda ms, name: calls.append((ms, name))
    )
    assert [name for _, name in calls] == [c["function"]["name"] for c in message["tool_calls"]]
    assert all(ms >= 0 for ms, _ in calls)
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
    assert len(calls) == len(replies)


@tool
def leave() -> str:
    """Exits the process."""
    raise SystemExit(4)


async def test_a_tool_that_calls_sys_exit_is_a_failure_the_model_reads() -> None:
    (reply,) = await execute_tool_calls({"tool_calls": [call("leave", {})]}, [leave])
    assert reply["content"] == "error: leave raised SystemExit: 4"


async def test_a_tool_still_lets_a_cancellation_through() -> None:
    started = asyncio.Event()

    @tool
    async def waits() -> str:
        """Waits until cancelled."""
        started.set()
        await asyncio.Event().wait()
        return "never"

    running = asyncio.create_task(execute_tool_calls({"tool_calls": [call("waits", {})]}, [waits]))
    await started.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running


async def test_a_cancelled_error_a_tool_raises_itself_is_a_failure_the_model_reads() -> None:
    @tool
    def cancelled() -> str:
        """Raises CancelledError while nothing cancels it."""
        raise asyncio.CancelledError("its own")

    (reply,) = await execute_tool_calls({"tool_calls": [call("cancelled", {})]}, [cancelled])
    assert reply["content"] == "error: cancelled raised CancelledError: its own"


def found(agent: Any) -> list[tuple[str, str | None]]:
    return [(issue.code, issue.field) for issue in validate(agent).issues]


class NotAsync(AgentLoop):
    name = "not-async"

    def run(self, ctx: RolloutContext) -> AgentResult:  # type: ignore[override]
        return ctx.complete([])

        def run(self, ctx: RolloutContext) -> AgentResult:  # type: ignore[override]
            return ctx.complete([])


class Unnamed(AgentLoop):  # abstract (no run), so the class statement allows it
    pass


class NeedsArguments(Good):
    name = "needs-arguments"

    def __init__(self, model: str) -> None:
        self.model = model


class NoContext(Good):
    name = "no-context"

    async def run(self) -> AgentResult:  # type: ignore[override]
        raise AssertionError("never runs")


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
        nameless = {"type": "function", "function": {"name": ""}}
        no_function = {"type": "function", "function": "add"}
        return [{"name": "bare"}, bad_params, nameless, no_function, add.schema, add.schema]


class Undescribed(Good):
    name = "undescribed"

    def get_tools(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"type": "function", "function": {"name": "x"}}]


def _untyped_tool() -> Tool:
    """A tool defined wrongly, kept as ``rollway validate``'s import keeps it."""
    token = DEFERRED_PROBLEMS.set(True)
    try:

        @tool
        def untyped(a) -> str:  # type: ignore[no-untyped-def]
            """No type on a."""
            return str(a)

        return untyped
    finally:
        DEFERRED_PROBLEMS.reset(token)


class BadToolDefinition(Good):
    tools = (_untyped_tool(),)


def test_validate_names_each_problem_and_what_it_is_about() -> None:
    assert validate(Good).issues == () and validate(Good()).valid
    assert found(int) == [("NOT_AN_AGENT", None)]
    assert found(Unnamed) == [("MISSING_NAME", "name"), ("RUN_NOT_IMPLEMENTED", "run")]
    assert found(NotAsync) == [("RUN_NOT_ASYNC", "run")]
    assert found(NoContext) == [("RUN_SIGNATURE", "run")]
    assert found(NeedsArguments) == [("CANNOT_INSTANTIATE", "__init__")]
    assert found(Raises) == [("GET_TOOLS_RAISED", "get_tools")]
    assert found(NotList) == [("TOOLS_NOT_A_LIST", "get_tools")]
    assert found(Malformed) == [
        ("BAD_TOOL_SCHEMA", "tools[0].type"),
        ("BAD_TOOL_SCHEMA", "tools[1].function.parameters"),
        ("BAD_TOOL_SCHEMA", "tools[2].function.name"),
        ("BAD_TOOL_SCHEMA", "tools[3].function"),
        ("DUPLICATE_TOOL_NAME", "tools[5].function.name"),
    ]
    assert found(Undescribed) == [("TOOL_WITHOUT_DESCRIPTION", "tools[0].function.description")]
    assert found(BadToolDefinition) == [("BAD_TOOL_DEFINITION", "tools[0]")]


def test_every_issue_code_is_produced_by_some_agent() -> None:
    agents = [int, Unnamed, NotAsync, NoContext, NeedsArguments, Raises, NotList, Malformed,
              Undescribed, BadToolDefinition]  # fmt: skip
    produced = {issue.code for agent in agents for issue in validate(agent).issues}
    assert produced == set(IssueCode)
    assert all(code == code.name for code in IssueCode)  # a code reads as its own name


def test_issue_details_hold_the_facts_behind_the_message() -> None:
    (raised,) = validate(Raises).issues
    assert raised.details == {"exception_type": "ValueError", "exception": "no tools today"}
    assert raised.message == "get_tools raised ValueError: no tools today"
    (built,) = validate(NeedsArguments).issues
    assert built.details["exception_type"] == "TypeError" and "model" in built.details["exception"]
    assert validate(NotList).issues[0].details == {"returned": "dict"}
    duplicate = validate(Malformed).errors[-1]
    assert duplicate.details == {"name": "add", "first_index": 4}
    assert validate(Undescribed).issues[0].details == {"name": "x"}


def test_errors_make_a_result_invalid_and_warnings_do_not() -> None:
    warned = validate(Undescribed)
    assert warned.valid and warned.errors == [] and len(warned.warnings) == 1
    warned.raise_if_invalid()  # warnings alone do not stop a run
    broken = validate(Malformed)
    assert not broken.valid and broken.warnings == [] and len(broken.errors) == 5
    with pytest.raises(AgentError) as raised:
        broken.raise_if_invalid()
    message = str(raised.value)
    assert message.startswith("agent Malformed is not ready: BAD_TOOL_SCHEMA (tools[0].type): ")
    assert message.count("BAD_TOOL_SCHEMA") == 4 and "DUPLICATE_TOOL_NAME" in message
    with pytest.raises(AgentError, match=r"RUN_NOT_ASYNC \(run\)"):
        ready_agent(NotAsync)
    assert isinstance(ready_agent(Undescribed), Undescribed)


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
    try:
        assert load_agent("from-file") is loaded
        with pytest.raises(ConfigError, match="already taken"):
            register_agent(type("Other", (loaded,), {"name": "from-file"}))
    finally:
        unregister_agent("from-file")
    with pytest.raises(ConfigError, match="not an AgentLoop"):
        load_agent("tests.agents.test_sdk:add")
    with pytest.raises(ConfigError, match="cannot import"):
        load_agent("no_such_module_here:Agent")


def test_the_registry_lists_sorted_names_and_forgets_on_request() -> None:
    before = list_agents()
    for cls in (Undescribed, Good, NotAsync):  # registered out of order
        register_agent(cls)
    try:
        listed = list_agents()
        assert list(listed) == sorted(listed)
        assert {n: c for n, c in listed.items() if n not in before} == {
            "good": Good, "not-async": NotAsync, "undescribed": Undescribed,
        }  # fmt: skip
        with pytest.raises(ConfigError) as unknown:
            load_agent("no-such-agent")
        message = str(unknown.value)
        assert "'no-such-agent' is not a registered name" in message
        assert "registered: " in message and "good, not-async, undescribed" in message
        assert "module:Class" in message  # the other ways to name an agent
    finally:
        assert unregister_agent("good") is Good
        unregister_agent("not-async")
        unregister_agent("undescribed")
    assert list_agents() == before
    with pytest.raises(ConfigError, match="no agent is registered as 'good'"):
        unregister_agent("good")


def test_only_agent_classes_can_be_registered() -> None:
    with pytest.raises(ConfigError, match="only AgentLoop subclasses"):
        register_agent(object)  # type: ignore[arg-type]
