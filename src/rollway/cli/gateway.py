"""``rollway gateway``: serve the recording gateway over HTTP."""

from __future__ import annotations

from typing import Annotated

import typer
import uvicorn

from rollway.cli.options import EngineOption, ModelOption, key_from_env
from rollway.gateway import build_gateway, create_app


def serve(
    engine: EngineOption = "embedded",
    model: ModelOption = None,
    host: Annotated[str, typer.Option(envvar="ROLLWAY_HOST")] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="ROLLWAY_PORT")] = 8000,
) -> None:
    """Start the gateway; the admin key is ROLLWAY_ADMIN_KEY, or generated and printed."""
    admin_key, generated = key_from_env("ROLLWAY_ADMIN_KEY", "ak")
    app = create_app(build_gateway(engine, model=model), admin_key=admin_key)
    typer.echo(f"rollway gateway on http://{host}:{port} (engine: {engine})")
    if generated:
        typer.echo(f"admin key: {admin_key}")
    uvicorn.run(app, host=host, port=port, log_level="warning")
