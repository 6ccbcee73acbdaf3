"""Ids and keys at the boundary: the one rule for ids that end up in URL paths and file paths
(rollout ids, experiment ids, idempotency keys), and the one way to compare keys.

An id is ASCII letters, digits, ``.``, ``_`` and ``-``, not starting with ``.``: it needs no
percent-encoding in a URL (``h#1`` or ``a?b`` would silently name another rollout), and it
cannot leave its folder (``.``, ``..``) or hide a file.
"""

from __future__ import annotations

import hmac
import re
from typing import Annotated

from pydantic import StringConstraints

from rollway.errors import ConfigError, InvalidFieldsError

ID_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$"
# Ids become file names (``<id>.json``, ``<id>-<12 hex>.json``), which may not pass 255 bytes.
ID_MAX_LENGTH = 200
#: Idempotency keys are a rollout id plus a suffix.
KEY_MAX_LENGTH = 220
#: A client's experiment id starts every rollout id it makes (``<exp>.<task>.<n>.<attempt>``).
EXP_ID_MAX_LENGTH = 100
#: A task's own ``task_id`` is its key up to this length; a longer one is hashed.
TASK_KEY_MAX_LENGTH = 64

SafeId = Annotated[
    str, StringConstraints(min_length=1, max_length=ID_MAX_LENGTH, pattern=ID_PATTERN)
]
IdempotencyKey = Annotated[
    str, StringConstraints(min_length=1, max_length=KEY_MAX_LENGTH, pattern=ID_PATTERN)
]

_ID = re.compile(ID_PATTERN)


def is_safe_id(value: str, max_length: int = ID_MAX_LENGTH) -> bool:
    return len(value) <= max_length and _ID.fullmatch(value) is not None


def check_id(value: str, param: str) -> str:
    """``value`` when it follows the id rule, else an ``InvalidFieldsError`` naming ``param``."""
    if not is_safe_id(value):
        raise InvalidFieldsError(_broken_rule(param, value, ID_MAX_LENGTH), param=param)
    return value


def id_from(text: str, max_length: int = EXP_ID_MAX_LENGTH) -> str:
    """An id made from free text (an agent's name, a file's stem): every run of characters the
    rule does not allow becomes ``-``, cut to ``max_length``; ``run`` when nothing is left."""
    made = re.sub(r"[^A-Za-z0-9._-]+", "-", text).lstrip(".")[:max_length]
    return made if is_safe_id(made, max_length) else "run"


def check_exp_id(value: str) -> str:
    """A client's experiment id: an id short enough that the rollout ids made from it are ids
    too; a ``ConfigError`` (the caller's setting) otherwise."""
    if not is_safe_id(value, EXP_ID_MAX_LENGTH):
        raise ConfigError(_broken_rule("exp_id", value, EXP_ID_MAX_LENGTH), param="exp_id")
    return value


def _broken_rule(param: str, value: str, max_length: int) -> str:
    return (
        f"{param} {value[:80]!r} is not a valid id: use 1-{max_length} ASCII letters, "
        "digits, '.', '_' or '-', not starting with '.'"
    )


def keys_match(given: str | None, expected: str) -> bool:
    """Constant-time comparison of a caller's key with the expected one. Compares bytes:
    ``hmac.compare_digest`` raises on non-ASCII ``str`` (a header may carry any latin-1)."""
    given_bytes = (given or "").encode("utf-8", "surrogatepass")
    return hmac.compare_digest(given_bytes, expected.encode("utf-8", "surrogatepass"))
