"""``rollway gateway``: serve the recording gateway over HTTP."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from rollway.cli.options import (
    EngineOption,
    KeepAliveOption,
    MaxConnectionsOption,
    ModelOption,
    RequestTimeoutOption,
    key_from_env,
)
from rollway.gateway import build_gateway, create_app
from rollway.gateway.http.rollout_lookup import Sessions
from rollway.gateway.render.renderers import RENDERERS
from rollway.gateway.workers.front_app import create_front_app
from rollway.gateway.workers.worker_pool import WorkerPool, watch_front
from rollway.web.uvicorn_server import ServerLimits, run_server

_DEFAULT = ServerLimits()


def serve(
    engine: EngineOption = "embedded",
    model: ModelOption = None,
    host: Annotated[str, typer.Option(envvar="ROLLWAY_HOST")] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="ROLLWAY_PORT")] = 8000,
    request_timeout: RequestTimeoutOption = _DEFAULT.request_timeout_s,
    keep_alive: KeepAliveOption = _DEFAULT.keep_alive_s,
    max_connections: MaxConnectionsOption = _DEFAULT.max_connections,
    rollout_ttl: Annotated[
        float,
        typer.Option(
            envvar="ROLLWAY_ROLLOUT_TTL",
            min=0.0,
            help="Seconds a rollout may sit unused before it is dropped (0: never).",
        ),
    ] = 3600.0,
    renderer: Annotated[
        str | None,
        typer.Option(
            envvar="ROLLWAY_RENDERER",
            help=f"The model family's renderer ({', '.join(RENDERERS)}); default: chosen "
            "from the model folder (its architecture, its chat template).",
        ),
    ] = None,
    workers: Annotated[
        int,
        typer.Option(
            envvar="ROLLWAY_GATEWAY_WORKERS",
            min=1,
            help="Gateway processes behind the one port (one per core to use); each rollout's "
            "calls reach the process that holds it. For remote engines (vllm://, sglang://): "
            "with the embedded engine each worker runs its own copy of the model on the same "
            "cores, slower than one process.",
        ),
    ] = 1,
    sessions: Annotated[
        Sessions,
        typer.Option(
            envvar="ROLLWAY_SESSIONS",
            case_sensitive=False,
            help="What an X-Session-ID header may do on the shared routes (/v1/chat/completions "
            "... at the root): off; known (name a registered rollout); open (also register one "
            "per new session with the gateway's defaults). Its key is ROLLWAY_SESSION_KEY, or "
            "generated and printed.",
        ),
    ] = Sessions.OFF,
) -> None:
    """Start the gateway; the admin key is ROLLWAY_ADMIN_KEY, or generated and printed."""
    admin_key, generated = key_from_env("ROLLWAY_ADMIN_KEY", "ak")
    session_key, session_generated = key_from_env("ROLLWAY_SESSION_KEY", "sk")
    limits = ServerLimits(request_timeout, keep_alive, max_connections)
    if workers > 1 and engine.partition(":")[0] == "embedded":
        typer.secho(
            f"warning: --workers {workers} with the embedded engine: each worker runs its own "
            "copy of the model on the same cores, slower than one process; workers help "
            "remote engines (vllm://, sglang://). docs/gateway.md",
            err=True,
            fg="yellow",
        )
    if workers > 1:
        options = {"--engine": engine, "--model": model, "--rollout-ttl": str(rollout_ttl),
                   "--renderer": renderer, "--request-timeout": str(request_timeout),
                   "--keep-alive": str(keep_alive),
                   "--max-connections": str(max_connections),
                   "--sessions": sessions.value}  # fmt: skip
        args = [part for name, value in options.items() if value for part in (name, value)]
        os.environ["ROLLWAY_SESSION_KEY"] = session_key  # the workers check it
        pool = WorkerPool(workers, args, admin_key, host, keep_alive)
        app = create_front_app(pool, admin_key=admin_key, rollout_ttl_s=rollout_ttl or None)
        engine = f"{engine}, {workers} workers"
    else:
        watch_front()  # a worker of a front (--workers N) ends with it
        gateway = build_gateway(
            engine, model=model, rollout_ttl_s=rollout_ttl or None, renderer=renderer
        )
        app = create_app(gateway, admin_key=admin_key, sessions=sessions, session_key=session_key)
    typer.echo(f"rollway gateway on http://{host}:{port} (engine: {engine})")
    if generated:
        typer.echo(f"admin key: {admin_key}")
    if sessions is not Sessions.OFF and session_generated:
        typer.echo(f"session key: {session_key}")
    run_server(app, limits, host=host, port=port)
