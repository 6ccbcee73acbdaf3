"""Checks of the numbers a user configures (counts, seconds): an error names the setting."""

from __future__ import annotations

import math
from typing import Any

from rollway.errors import ConfigError


def is_number(value: Any) -> bool:
    """An int or a float, not a bool (``True`` is an int to Python, never a count here)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def finite_float(value: Any) -> float | None:
    """``value`` as a float when it is a number (not a bool) that a float holds and is finite;
    None for NaN, an infinity, an int too large for a float (``10**400``), or no number."""
    if not is_number(value):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def shown_number(value: Any) -> str:
    """A number as an error names it: a huge int by its size (its digits may be thousands)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    return repr(value)


#: The longest rollout in tokens anyone may ask: an int32, what engines and trainers count in.
MAX_SEQ_LEN = 2**31 - 1


def check_count(
    name: str, value: Any, *, least: int, most: int | None = None, optional: bool = False
) -> None:
    if value is None and optional:
        return
    whole = isinstance(value, int) and not isinstance(value, bool)
    if not whole or value < least or (most is not None and value > most):
        within = f"from {least} to {most}" if most is not None else f"of at least {least}"
        raise ConfigError(f"{name} must be a whole number {within}", name)


def check_seconds(name: str, seconds: Any, *, zero: bool = False, finite: bool = False) -> None:
    """Positive seconds (``zero``: or 0; ``finite``: not infinite); NaN never passes."""
    if finite and not (is_number(seconds) and seconds < math.inf):
        raise ConfigError(f"{name} must be a finite number of seconds, 0 or more", name)
    if not (is_number(seconds) and (seconds > 0 or (zero and seconds == 0))):
        least = "0 or a positive" if zero else "a positive"
        raise ConfigError(f"{name} must be {least} number of seconds", name)
