"""``rollway model``: manage the embedded model's cached copy."""

from __future__ import annotations

import typer

from rollway.model_folders import prepare_default_model

app = typer.Typer(no_args_is_help=True, help="The embedded model.")


@app.command("prepare")
def prepare() -> None:
    """Convert the packaged SmolLM2 GGUF to a cached safetensors folder (once)."""
    typer.echo(f"default model ready in {prepare_default_model()}")
