"""Options shared by several commands."""

from __future__ import annotations

import os
import secrets
from typing import Annotated

import typer

from rollway.engines.factory import engine_help

EngineOption = Annotated[
    str,
    typer.Option(
        "--engine",
        envvar="ROLLWAY_ENGINE",
        help=f"{engine_help()} (README: Engines)",
    ),
]
ModelOption = Annotated[
    str | None,
    typer.Option(
        "--model", envvar="ROLLWAY_MODEL", help="Local HF model folder (default: SmolLM2)."
    ),
]


def key_from_env(variable: str, prefix: str) -> tuple[str, bool]:
    """The key in ``variable``, or a fresh one and True (print it: nobody else knows it)."""
    given = os.environ.get(variable)
    return (given, False) if given else (f"{prefix}-{secrets.token_urlsafe(24)}", True)


# How a server faces the network (see rollway.web.uvicorn_server.ServerLimits).
RequestTimeoutOption = Annotated[
    float,
    typer.Option(
        "--request-timeout",
        envvar="ROLLWAY_REQUEST_TIMEOUT",
        min=0.1,
        help="Seconds a client has to send a whole request; then its connection is closed.",
    ),
]
KeepAliveOption = Annotated[
    float,
    typer.Option(
        "--keep-alive",
        envvar="ROLLWAY_KEEP_ALIVE",
        min=0.1,
        help="Seconds an idle connection stays open between requests.",
    ),
]
MaxConnectionsOption = Annotated[
    int,
    typer.Option(
        "--max-connections",
        envvar="ROLLWAY_MAX_CONNECTIONS",
        min=1,
        help="Connections and requests at once; beyond, requests get 503.",
    ),
]
