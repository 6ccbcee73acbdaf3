"""Check an agent before any rollout starts; problems come back as coded issues."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Literal

from rollway.agents.base import AgentLoop
from rollway.agents.registry import load_agent
from rollway.errors import AgentError


@dataclass(frozen=True, slots=True)
class Issue:
    """One finding. Codes: E1xx the class, E2xx tools, W2xx tool warnings."""

    code: str
    severity: Literal["error", "warning"]
    message: str


def validate(agent: type[AgentLoop] | AgentLoop) -> list[Issue]:
    """Errors and warnings about ``agent`` (a class or an instance); empty means ready."""
    cls = agent if isinstance(agent, type) else type(agent)
    issues: list[Issue] = []
    if not issubclass(cls, AgentLoop):
        return [Issue("E100", "error", f"{cls.__qualname__} is not an AgentLoop subclass")]
    if not (isinstance(cls.name, str) and cls.name.strip()):
        issues.append(Issue("E101", "error", "the agent has no non-empty `name`"))
    if getattr(cls.run, "__isabstractmethod__", False):
        issues.append(Issue("E102", "error", "`run` is not implemented"))
    elif not inspect.iscoroutinefunction(cls.run):
        issues.append(Issue("E103", "error", "`run` must be `async def run(self, ctx)`"))
    if issues:
        return issues
    try:
        instance = agent if isinstance(agent, AgentLoop) else cls()
    except Exception as exc:
        return [Issue("E104", "error", f"the agent cannot be built without arguments: {exc!r}")]
    return _check_tools(instance)


def ready_agent(agent: AgentLoop | type[AgentLoop] | str) -> AgentLoop:
    """An agent instance that passed ``validate`` (a ``"module:Class"`` string is loaded first);
    else ``AgentError`` listing the problems."""
    if isinstance(agent, str):
        agent = load_agent(agent)
    errors = [i for i in validate(agent) if i.severity == "error"]
    if errors:
        listed = "; ".join(f"{i.code} {i.message}" for i in errors)
        raise AgentError(f"agent is not ready: {listed}")
    return agent if isinstance(agent, AgentLoop) else agent()


def _check_tools(agent: AgentLoop) -> list[Issue]:
    try:
        tools: Any = agent.get_default_tools()
    except Exception as exc:
        return [Issue("E201", "error", f"get_tools raised {type(exc).__name__}: {exc}")]
    if not isinstance(tools, list):
        return [Issue("E202", "error", f"get_tools returned {type(tools).__name__}, not a list")]
    issues: list[Issue] = []
    names: set[str] = set()
    for index, schema in enumerate(tools):
        problem = _schema_problem(schema)
        if problem:
            issues.append(Issue("E203", "error", f"tool {index}: {problem}"))
            continue
        name = schema["function"]["name"]
        if name in names:
            issues.append(Issue("E204", "error", f"tool name {name!r} is used twice"))
        names.add(name)
        if not schema["function"].get("description"):
            issues.append(Issue("W201", "warning", f"tool {name!r} has no description"))
    return issues


def _schema_problem(schema: Any) -> str | None:
    if not isinstance(schema, dict) or schema.get("type") != "function":
        return 'not a {"type": "function", ...} object'
    function = schema.get("function")
    if not isinstance(function, dict):
        return "has no `function` object"
    if not isinstance(function.get("name"), str) or not function["name"]:
        return "function has no name"
    parameters = function.get("parameters", {"type": "object"})
    if not isinstance(parameters, dict) or parameters.get("type") != "object":
        return "parameters must be a JSON Schema with type 'object'"
    return None
