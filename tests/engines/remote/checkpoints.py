"""Checkpoint folders for weight-sync tests: a server (and the engine's own check) reads them."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file


def write_checkpoint(folder: Path) -> Path:
    """A folder holding one small tensor in ``model.safetensors``; returned."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file({"model.norm.weight": torch.ones(4)}, str(folder / "model.safetensors"))
    return folder
