"""``rollway validate``: check an agent before running it."""

from __future__ import annotations

from typing import Annotated

import typer

from rollway.agents.registry import load_agent
from rollway.agents.validate import validate as validate_agent


def validate(
    agent: Annotated[str, typer.Argument(help="module:Class, path/to/file.py:Class, or a name.")],
) -> None:
    """List the agent's problems (code, what it is about, message); exit 1 if any is an error."""
    cls = load_agent(agent)
    result = validate_agent(cls)
    for issue in result.issues:
        color = "red" if issue.severity == "error" else "yellow"
        where = issue.field or "-"
        typer.secho(f"{issue.severity} {issue.code} {where}: {issue.message}", fg=color)
    if not result.valid:
        raise typer.Exit(1)
    tools = [t["function"]["name"] for t in cls().get_default_tools()]
    typer.echo(f"agent {cls.name!r} is ready; tools: {', '.join(tools) or 'none'}")
