"""Options shared by several commands."""

from __future__ import annotations

import os
import secrets
from typing import Annotated

import typer

EngineOption = Annotated[
    str, typer.Option("--engine", envvar="ROLLWAY_ENGINE", help="embedded | sim")
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
