"""``rollway validate``: check an agent, or every agent of a file, before running it. The file is
imported with definition problems deferred (a class without ``name``, a ``@tool`` with an
untyped parameter), so that each is reported with the rest instead of stopping the import."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Annotated

import typer

from rollway.agents.base import AgentLoop
from rollway.agents.registry import agent_classes, import_target, load_agent
from rollway.agents.tools import DEFERRED_PROBLEMS
from rollway.agents.validate import ValidationResult
from rollway.agents.validate import validate as validate_agent
from rollway.errors import ConfigError


def validate(
    agent: Annotated[
        str,
        typer.Argument(
            help="module:Class, path/to/file.py:Class, a name, or a module or file.py alone "
            "(every agent class defined in it)."
        ),
    ],
) -> None:
    """List each agent's problems (code, what it is about, message) in one pass; exit 1 if any
    is an error."""
    with _deferred():
        classes = _agent_classes(agent)
    ready = True
    for cls in classes:
        result = validate_agent(cls)
        _show(result, cls, several=len(classes) > 1)
        ready = ready and result.valid
    if not ready:
        raise typer.Exit(1)


def _agent_classes(spec: str) -> list[type[AgentLoop]]:
    if ":" in spec or not (spec.endswith(".py") or "." in spec):
        return [load_agent(spec)]
    found = agent_classes(import_target(spec))
    if not found:
        raise ConfigError(f"{spec} defines no AgentLoop subclass", param="agent")
    return found


@contextlib.contextmanager
def _deferred() -> Iterator[None]:
    token = DEFERRED_PROBLEMS.set(True)
    try:
        yield
    finally:
        DEFERRED_PROBLEMS.reset(token)


def _show(result: ValidationResult, cls: type[AgentLoop], several: bool) -> None:
    prefix = f"{cls.__qualname__}: " if several else ""
    for issue in result.issues:
        color = "red" if issue.severity == "error" else "yellow"
        where = issue.field or "-"
        typer.secho(f"{prefix}{issue.severity} {issue.code} {where}: {issue.message}", fg=color)
    if result.valid:
        tools = [t["function"]["name"] for t in cls().get_default_tools()]
        typer.echo(f"{prefix}agent {cls.name!r} is ready; tools: {', '.join(tools) or 'none'}")
