"""``rollway serve-agent``: serve an AgentLoop over HTTP for clients on other machines."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rollway.agents.server import AgentServerConfig, create_app
from rollway.cli.options import (
    KeepAliveOption,
    MaxConnectionsOption,
    RequestTimeoutOption,
    key_from_env,
)
from rollway.web.uvicorn_server import ServerLimits, run_server

_DEFAULT = ServerLimits()


def serve(
    agent: Annotated[str, typer.Argument(help="module:Class, path/to/file.py:Class, or a name.")],
    host: Annotated[str, typer.Option(envvar="ROLLWAY_HOST")] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="ROLLWAY_PORT")] = 8100,
    store: Annotated[
        str | None,
        typer.Option(
            envvar="ROLLWAY_OUT",
            help="Where reports go (the clients' results root: a folder or s3://bucket/prefix).",
        ),
    ] = None,
    max_concurrent: Annotated[int, typer.Option(min=1, help="Rollouts at once (429 beyond).")] = 64,
    ttl: Annotated[float, typer.Option(help="Seconds a finished rollout stays in memory.")] = 3600,
    debug_dir: Annotated[
        Path | None, typer.Option(help="Per-rollout debug JSONL, for inits that ask for it.")
    ] = None,
    request_timeout: RequestTimeoutOption = _DEFAULT.request_timeout_s,
    keep_alive: KeepAliveOption = _DEFAULT.keep_alive_s,
    max_connections: MaxConnectionsOption = _DEFAULT.max_connections,
) -> None:
    """Serve AGENT; the key is ROLLWAY_AGENT_KEY, or generated and printed. The agent is
    validated first: an invalid agent is refused and nothing is served."""
    api_key, generated = key_from_env("ROLLWAY_AGENT_KEY", "ag")
    config = AgentServerConfig(
        store=store, max_concurrent=max_concurrent, ttl_s=ttl, debug_dir=debug_dir
    )
    app = create_app(agent, api_key=api_key, config=config)
    name = app.state.service.agent.name
    typer.echo(f"rollway agent server for {name!r} on http://{host}:{port}")
    if generated:
        typer.echo(f"agent key: {api_key}")
    limits = ServerLimits(request_timeout, keep_alive, max_connections)
    run_server(app, limits, host=host, port=port)
