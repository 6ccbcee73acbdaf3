"""JSON bytes of any value a record may hold: orjson, fast, and the standard library for what
orjson refuses (an integer past 64 bits, which a task, a reward's components or the messages
may carry, and which pydantic writes into records fine)."""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(value: Any) -> bytes:
    """``value`` as compact JSON; non-finite floats as null, as orjson and pydantic write them."""
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson: "Integer exceeds 64-bit range"
        return json.dumps(_finite(value), separators=(",", ":"), default=str).encode()


def _finite(value: Any) -> Any:
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value
