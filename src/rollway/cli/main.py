"""The ``rollway`` command: a tiny main that wires the command groups."""

from __future__ import annotations

import logging
import os

import typer

from rollway import logs
from rollway.cli import (
    demo,
    export,
    failures,
    gateway,
    model,
    run,
    serve_agent,
    sim_server,
    validate,
)

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Collect agentic RL rollouts.")
app.command("run")(run.run)
app.command("validate")(validate.validate)
app.command("export")(export.export)
app.command("gateway")(gateway.serve)
app.command("serve-agent")(serve_agent.serve)
app.command("sim-server")(sim_server.serve)
app.command("demo")(demo.run)
app.add_typer(model.app, name="model")


def main() -> None:
    level = logging.getLevelName(os.environ.get("ROLLWAY_LOG_LEVEL", "WARNING").upper())
    logs.configure(level if isinstance(level, int) else logging.WARNING)
    # Batch status lines are part of a run's output, whatever the level of the rest.
    client = logging.getLogger("rollway.client")
    client.setLevel(min(logging.INFO, logging.getLogger().level))
    with failures.reported():
        app()
