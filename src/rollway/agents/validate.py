"""Check an agent before any rollout starts: a ``ValidationResult`` of named issues, each saying
which attribute or tool it is about."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from rollway.agents.base import AgentLoop
from rollway.agents.registry import load_agent
from rollway.agents.tools import Tool
from rollway.errors import AgentError

Severity = Literal["error", "warning"]


class IssueCode(StrEnum):
    """What is wrong; each code equals its own name as a string."""

    # The class.
    NOT_AN_AGENT = "NOT_AN_AGENT"
    MISSING_NAME = "MISSING_NAME"
    RUN_NOT_IMPLEMENTED = "RUN_NOT_IMPLEMENTED"
    RUN_NOT_ASYNC = "RUN_NOT_ASYNC"
    RUN_SIGNATURE = "RUN_SIGNATURE"
    CANNOT_INSTANTIATE = "CANNOT_INSTANTIATE"
    # Its tools.
    BAD_TOOL_DEFINITION = "BAD_TOOL_DEFINITION"
    GET_TOOLS_RAISED = "GET_TOOLS_RAISED"
    TOOLS_NOT_A_LIST = "TOOLS_NOT_A_LIST"
    BAD_TOOL_SCHEMA = "BAD_TOOL_SCHEMA"
    DUPLICATE_TOOL_NAME = "DUPLICATE_TOOL_NAME"
    # Warnings: the agent runs, but the model is told less than it could be.
    TOOL_WITHOUT_DESCRIPTION = "TOOL_WITHOUT_DESCRIPTION"


@dataclass(frozen=True, slots=True)
class ValidationIssue:
    """One finding. ``field`` names what it is about (``"name"``, ``"run"``,
    ``"tools[2].function.name"``; None for the object as a whole); ``details`` holds the facts
    behind the message (an exception's type and text, a tool's name)."""

    code: IssueCode
    severity: Severity
    message: str
    field: str | None = None
    details: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        where = f" ({self.field})" if self.field else ""
        return f"{self.code}{where}: {self.message}"


@dataclass(frozen=True, slots=True)
class ValidationResult:
    """Every issue found in ``agent`` (the class's qualified name); ``valid`` when none is an
    error (warnings do not stop a run)."""

    agent: str
    issues: tuple[ValidationIssue, ...] = ()

    @property
    def errors(self) -> list[ValidationIssue]:
        return [i for i in self.issues if i.severity == "error"]

    @property
    def warnings(self) -> list[ValidationIssue]:
        return [i for i in self.issues if i.severity == "warning"]

    @property
    def valid(self) -> bool:
        return not self.errors

    def raise_if_invalid(self) -> None:
        """``AgentError`` listing every error, if there is one."""
        if self.errors:
            listed = "; ".join(str(i) for i in self.errors)
            raise AgentError(f"agent {self.agent} is not ready: {listed}")


def validate(agent: type[AgentLoop] | AgentLoop) -> ValidationResult:
    """What is wrong with ``agent`` (a class or an instance); ``valid`` means ready to run."""
    cls = agent if isinstance(agent, type) else type(agent)
    return ValidationResult(cls.__qualname__, tuple(_find_issues(agent, cls)))


def ready_agent(agent: AgentLoop | type[AgentLoop] | str) -> AgentLoop:
    """An agent instance that passed ``validate`` (a ``"module:Class"`` string is loaded first);
    else ``AgentError`` listing the problems."""
    if isinstance(agent, str):
        agent = load_agent(agent)
    validate(agent).raise_if_invalid()
    return agent if isinstance(agent, AgentLoop) else agent()


def _find_issues(agent: type[AgentLoop] | AgentLoop, cls: type) -> list[ValidationIssue]:
    if not issubclass(cls, AgentLoop):
        message = f"{cls.__qualname__} is not an AgentLoop subclass"
        return [_error(IssueCode.NOT_AN_AGENT, message, None, type=cls.__qualname__)]
    issues: list[ValidationIssue] = []
    if not (isinstance(cls.name, str) and cls.name.strip()):
        issues.append(_error(IssueCode.MISSING_NAME, "the agent has no non-empty `name`", "name"))
    if getattr(cls.run, "__isabstractmethod__", False):
        issues.append(_error(IssueCode.RUN_NOT_IMPLEMENTED, "`run` is not implemented", "run"))
    elif not inspect.iscoroutinefunction(cls.run):
        message = "`run` must be `async def run(self, ctx)`"
        issues.append(_error(IssueCode.RUN_NOT_ASYNC, message, "run"))
    elif not _takes_ctx(cls.run):
        message = (
            f"`run` must take the context: `async def run(self, ctx)`, not {_signature(cls.run)}"
        )
        issues.append(_error(IssueCode.RUN_SIGNATURE, message, "run"))
    issues += _tool_definitions(cls)
    try:
        # Its tools are checked even where the class has problems: every problem in one pass.
        instance = agent if isinstance(agent, AgentLoop) else (_probe(cls) if issues else cls)()
    except Exception as exc:
        message = f"the agent cannot be built without arguments: {exc!r}"
        return [*issues, _error(IssueCode.CANNOT_INSTANTIATE, message, "__init__", **_raised(exc))]
    return issues + _check_tools(instance)


def _probe(cls: type[AgentLoop]) -> type[AgentLoop]:
    """``cls`` with a name and a ``run``, to build where it has neither (its own problems are
    reported already) and check its tools."""

    async def run(self: AgentLoop, ctx: Any) -> Any:
        raise NotImplementedError

    return type(cls.__name__, (cls,), {"name": cls.name or "unnamed", "run": run})


def _tool_definitions(cls: type[AgentLoop]) -> list[ValidationIssue]:
    """Tools in ``cls.tools`` whose definition failed (kept by ``rollway validate``'s import)."""
    tools = cls.tools if isinstance(cls.tools, list | tuple) else ()
    return [
        _error(IssueCode.BAD_TOOL_DEFINITION, t.problem, f"tools[{i}]", name=t.name)
        for i, t in enumerate(tools)
        if isinstance(t, Tool) and t.problem
    ]


def _takes_ctx(run: Any) -> bool:
    try:
        inspect.signature(run).bind(object(), object())  # self, ctx
    except (TypeError, ValueError):
        return False
    return True


def _signature(run: Any) -> str:
    try:
        return f"run{inspect.signature(run)}"
    except (TypeError, ValueError):
        return "an uninspectable run"


def _check_tools(agent: AgentLoop) -> list[ValidationIssue]:
    try:
        tools: Any = agent.get_default_tools()
    except Exception as exc:
        message = f"get_tools raised {type(exc).__name__}: {exc}"
        return [_error(IssueCode.GET_TOOLS_RAISED, message, "get_tools", **_raised(exc))]
    if not isinstance(tools, list):
        returned = type(tools).__name__
        message = f"get_tools returned {returned}, not a list"
        return [_error(IssueCode.TOOLS_NOT_A_LIST, message, "get_tools", returned=returned)]
    issues: list[ValidationIssue] = []
    first_index: dict[str, int] = {}
    for index, schema in enumerate(tools):
        problem = _schema_problem(schema)
        if problem:
            where, what = problem
            message = f"tool {index}: {what}"
            issues.append(_error(IssueCode.BAD_TOOL_SCHEMA, message, f"tools[{index}]{where}"))
            continue
        name = schema["function"]["name"]
        if name in first_index:
            issues.append(
                _error(
                    IssueCode.DUPLICATE_TOOL_NAME,
                    f"tool name {name!r} is used twice",
                    f"tools[{index}].function.name",
                    name=name,
                    first_index=first_index[name],
                )
            )
        first_index.setdefault(name, index)
        if not schema["function"].get("description"):
            issues.append(
                ValidationIssue(
                    IssueCode.TOOL_WITHOUT_DESCRIPTION,
                    "warning",
                    f"tool {name!r} has no description",
                    f"tools[{index}].function.description",
                    {"name": name},
                )
            )
    return issues


def _schema_problem(schema: Any) -> tuple[str, str] | None:
    """Where in one tool schema the first problem is (a suffix of ``tools[i]``), and what."""
    if not isinstance(schema, dict) or schema.get("type") != "function":
        return ".type", 'not a {"type": "function", ...} object'
    function = schema.get("function")
    if not isinstance(function, dict):
        return ".function", "has no `function` object"
    if not isinstance(function.get("name"), str) or not function["name"]:
        return ".function.name", "function has no name"
    parameters = function.get("parameters", {"type": "object"})
    if not isinstance(parameters, dict) or parameters.get("type") != "object":
        return ".function.parameters", "parameters must be a JSON Schema with type 'object'"
    return None


def _error(code: IssueCode, message: str, where: str | None, **details: Any) -> ValidationIssue:
    return ValidationIssue(code, "error", message, where, details)


def _raised(exc: Exception) -> dict[str, str]:
    return {"exception_type": type(exc).__name__, "exception": str(exc)}
