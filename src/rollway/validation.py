"""Data checked against a pydantic model, the error naming the field: one rule for a body read
off the wire (``web``'s handlers) and for the same data passed in process (the gateway's core,
a rollout's sampling), so neither needs the other's HTTP stack."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from rollway.errors import InvalidFieldsError

ModelT = TypeVar("ModelT", bound=BaseModel)

# How pydantic labels the branches of a union in an error's location (``content.str``,
# ``input.list[...]``): no field of a wire model is named so.
_TYPE_LABELS = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


def _is_union_label(part: str | int) -> bool:
    return isinstance(part, str) and (part in _TYPE_LABELS or not part.isidentifier())


def parse_model(model: type[ModelT], data: Any, *, strict: bool = True) -> ModelT:
    """Validate ``data`` as ``model``, turning pydantic's error into one that names the field.
    The deepest error is named: for a union that is the branch that got furthest.

    Strict by default, for data read off the wire: JSON has real numbers and booleans, so
    ``"0.5"`` for a float or ``true`` for an int is the caller's mistake, not something to
    coerce (an int for a float is still a number). ``strict=False`` is for Python callers,
    whose tuples stand for lists."""
    try:
        return model.model_validate(data, strict=strict)
    except ValidationError as exc:
        first = max(exc.errors(include_url=False), key=lambda e: len(e["loc"]))
        where = ".".join(str(p) for p in first["loc"] if not _is_union_label(p)) or "body"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise InvalidFieldsError(f"{where}: {first['msg']}{more}", param=where) from None
