"""Turns for tests, written with whole prompts (as an engine got them) and recorded as the
trajectory format keeps them (each turn's new prompt ids)."""

from __future__ import annotations

from typing import Any

from rollway.trajectory import Turn
from rollway.trajectory_format import cut_prompts


def chain(turns: list[dict[str, Any]]) -> list[Turn]:
    """``turns`` (dicts of ``Turn`` fields, ``prompt_ids`` whole) as recorded turns."""
    return [Turn.model_validate(turn) for turn in cut_prompts(turns)]
