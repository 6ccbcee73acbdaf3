"""The ``rollway`` command: a tiny main that wires the command groups."""

from __future__ import annotations

import logging
import os

import typer

from rollway import logs, tracing
from rollway.cli import (
    demo_command,
    export_command,
    failures,
    gateway_command,
    model_command,
    rescore_command,
    run_command,
    serve_agent_command,
    sim_server_command,
    validate_command,
    view_command,
)

# Plain help: the rich layout cuts option values and help text to fit its columns.
app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Collect agentic RL rollouts.",
    rich_markup_mode=None,
)
app.command("run")(run_command.run)
app.command("validate")(validate_command.validate)
app.command("export")(export_command.export)
app.command("rescore")(rescore_command.rescore)
app.command("gateway")(gateway_command.serve)
app.command("serve-agent")(serve_agent_command.serve)
app.command("sim-server")(sim_server_command.serve)
app.command("demo")(demo_command.run)
app.command("view")(view_command.view)
app.add_typer(model_command.app, name="model")


def main() -> None:
    level = logging.getLevelName(os.environ.get("ROLLWAY_LOG_LEVEL", "WARNING").upper())
    logs.configure(level if isinstance(level, int) else logging.WARNING)
    # Batch status lines are part of a run's output, whatever the level of the rest.
    client = logging.getLogger("rollway.client")
    client.setLevel(min(logging.INFO, logging.getLogger().level))
    with failures.reported():
        # ROLLWAY_TRACE=1: every command's process traces (a served gateway, agent server).
        tracing.enable_if(False)
        app()
