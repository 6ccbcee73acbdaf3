"""``rollway gateway``: serve the recording gateway over HTTP."""

from __future__ import annotations

import os
import secrets
from typing import Annotated

import typer
import uvicorn

from rollway.cli.options import EngineOption, ModelOption
from rollway.gateway import build_gateway, create_app


def serve(
    engine: EngineOption = "embedded",
    model: ModelOption = None,
    host: Annotated[str, typer.Option(envvar="ROLLWAY_HOST")] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="ROLLWAY_PORT")] = 8000,
) -> None:
    """Start the gateway; the admin key is ROLLWAY_ADMIN_KEY, or generated and printed."""
    admin_key = os.environ.get("ROLLWAY_ADMIN_KEY")
    generated = admin_key is None
    admin_key = admin_key or f"ak-{secrets.token_urlsafe(24)}"
    app = create_app(build_gateway(engine, model=model), admin_key=admin_key)
    typer.echo(f"rollway gateway on http://{host}:{port} (engine: {engine})")
    if generated:
        typer.echo(f"admin key: {admin_key}")
    uvicorn.run(app, host=host, port=port, log_level="warning")
