"""Turns for tests, written with whole prompts (as an engine got them) and recorded as the
trajectory format keeps them (each turn's new prompt ids, and the hash of its whole prompt)."""

from __future__ import annotations

from typing import Any

from rollway.trajectory import Turn
from rollway.trajectory_format import cut_prompts, prompt_hash


def chain(turns: list[dict[str, Any]]) -> list[Turn]:
    """``turns`` (dicts of ``Turn`` fields, ``prompt_ids`` whole) as recorded turns, each with
    its whole prompt's ``prompt_hash`` (as the gateway records it: the chain holds)."""
    hashed = [turn | {"prompt_hash": prompt_hash(turn["prompt_ids"])} for turn in turns]
    return [Turn.model_validate(turn) for turn in cut_prompts(hashed)]
