"""``@tool``: a typed Python function as an OpenAI function tool, with argument validation.

``execute_tool_calls`` runs a turn's tool calls; every failure (unknown tool, bad JSON, invalid
arguments, an exception) becomes a tool message the model can read, never a crashed rollout.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from rollway.errors import AgentError, is_failure

#: While set (``rollway validate`` importing a file), a tool or agent class that is defined
#: wrongly is kept with its problem instead of raising: one mistake must not hide the others.
DEFERRED_PROBLEMS: ContextVar[bool] = ContextVar("rollway_deferred_problems", default=False)


@dataclass(frozen=True)
class Tool:
    """A callable tool: its OpenAI schema plus a validating async ``call``."""

    name: str
    description: str
    arguments: type[BaseModel]
    fn: Callable[..., Any]
    #: What is wrong with its definition, where that was deferred (``DEFERRED_PROBLEMS``).
    problem: str | None = None

    @property
    def schema(self) -> dict[str, Any]:
        parameters = _strip_titles(self.arguments.model_json_schema())
        function = {"name": self.name, "description": self.description, "parameters": parameters}
        return {"type": "function", "function": function}

    async def call(self, arguments: dict[str, Any]) -> Any:
        """Validate ``arguments`` (raises pydantic's ValidationError) and run the function."""
        parsed = self.arguments.model_validate(arguments)
        values = {name: getattr(parsed, name) for name in type(parsed).model_fields}
        result = self.fn(**values)
        return await result if inspect.isawaitable(result) else result

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def tool(
    fn: Callable[..., Any] | None = None, *, name: str | None = None, description: str | None = None
) -> Any:
    """Decorate a typed function (sync or async) to make it a ``Tool``.

    Parameter types come from the hints (``Annotated[int, Field(description=...)]`` works); the
    description from ``description`` or the docstring's first paragraph.
    """

    def build(func: Callable[..., Any]) -> Tool:
        doc = (description or inspect.getdoc(func) or "").split("\n\n")[0].strip()
        try:
            model = _arguments_model(func)
        except AgentError as exc:
            if not DEFERRED_PROBLEMS.get():
                raise
            return Tool(name or func.__name__, doc, _NoArguments, func, problem=str(exc))
        return Tool(name or func.__name__, doc, model, func)

    return build(fn) if fn is not None else build


class _NoArguments(BaseModel):
    """The arguments of a tool whose definition failed (kept only for ``rollway validate``)."""


def _arguments_model(func: Callable[..., Any]) -> type[BaseModel]:
    """The pydantic model of ``func``'s parameters; ``AgentError`` when one cannot be a tool
    argument (untyped, ``*args``, ``**kwargs``)."""
    hints = get_type_hints(func, include_extras=True)
    fields: dict[str, Any] = {}
    for param in inspect.signature(func).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise AgentError(f"tool {func.__name__!r} cannot take *args or **kwargs")
        if param.name not in hints:
            raise AgentError(f"tool {func.__name__!r}: parameter {param.name!r} needs a type")
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (hints[param.name], default)
    return create_model(
        f"{func.__name__}_arguments", __config__=ConfigDict(extra="forbid"), **fields
    )


async def execute_tool_calls(
    message: dict[str, Any],
    tools: Sequence[Tool],
    on_call: Callable[[float, str], None] | None = None,
) -> list[dict[str, Any]]:
    """Run the calls in an assistant ``message``; one tool message per call, in order.

    ``on_call`` receives each call's latency in ms and the tool's name (``ctx.record_tool_call``
    fits: it counts the call in the rollout's metrics and tells the client's event listeners).
    """
    by_name = {t.name: t for t in tools}
    replies = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", {})
        started = time.perf_counter()
        content = await _run_one(by_name, function.get("name"), function.get("arguments"))
        if on_call is not None:
            on_call((time.perf_counter() - started) * 1000.0, str(function.get("name")))
        replies.append({"role": "tool", "tool_call_id": call.get("id"), "content": content})
    return replies


async def _run_one(by_name: dict[str, Tool], name: Any, raw: Any) -> str:
    found = by_name.get(name)
    if found is None:
        return f"error: unknown tool {name!r}; available: {', '.join(sorted(by_name)) or 'none'}"
    try:
        arguments = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError as exc:
        return f"error: arguments for {name!r} are not valid JSON: {exc}"
    if not isinstance(arguments, dict):
        return f"error: arguments for {name!r} must be a JSON object"
    try:
        result = await found.call(arguments)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors()
        )
        return f"error: invalid arguments for {name!r}: {problems}"
    except BaseException as exc:  # the model reads the failure and may try again
        if not is_failure(exc):
            raise
        return f"error: {name} raised {type(exc).__name__}: {exc}"
    return result if isinstance(result, str) else json.dumps(result, default=str)


def _strip_titles(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _strip_titles(v) for k, v in schema.items() if k != "title"}
    if isinstance(schema, list):
        return [_strip_titles(v) for v in schema]
    return schema
