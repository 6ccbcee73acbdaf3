"""Options shared by several commands."""

from __future__ import annotations

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
