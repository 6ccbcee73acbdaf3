"""The viewer's reading of a run's files, one at a time and tolerant of bad ones.

A record that does not read (not JSON, a format this rollway does not know, a field missing or
of the wrong type, a JSON list, a symbolic link, a folder) is an ``Unreadable`` with its reason,
so one bad record never takes the listing or the other rollouts' pages down. A reason never
quotes the file: a link is not followed at all (it could point at any file on the machine), and
a validation error is told by its fields and messages, never by the input it met.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from rollway.errors import RollwayError
from rollway.results import RolloutRecord
from rollway.store import Store

#: The longest reason kept (a record with many bad fields: its first errors).
MAX_REASON_CHARS = 300
#: Validation errors a reason names before it counts the rest.
NAMED_ERRORS = 3
_NO_FOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A run's record that the viewer cannot show, and why (never its content)."""

    key: str
    reason: str

    def as_row(self) -> dict[str, str]:
        return {"key": self.key, "reason": self.reason}


def read_plain_file(path: Path) -> bytes:
    """The bytes of ``path`` if it is a regular file, opened without following a symbolic link
    at its end (the run's own folders above it are the user's choice). FileNotFoundError where
    there is none; any other OSError's ``strerror`` says why it was not read."""
    try:
        fd = os.open(path, _NO_FOLLOW)  # O_NONBLOCK: a FIFO does not hang the open
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(exc.errno, "a symbolic link (never followed)", str(path)) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        with os.fdopen(fd, "rb", closefd=False) as file:
            return file.read()
    finally:
        os.close(fd)


def load_record(store: Store, folder: Path | None, key: str) -> RolloutRecord | Unreadable | None:
    """The run's record ``key``; None where there is none. A local run's file is read here
    (``read_plain_file``), an object store's through the store."""
    try:
        if folder is None:
            return store.get(key)
        data = read_plain_file(folder / "trajectories" / f"{key}.json")
        return RolloutRecord.model_validate_json(data)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return Unreadable(key, _clipped(exc.strerror or type(exc).__name__))
    except ValidationError as exc:
        return Unreadable(key, describe(exc))
    except RollwayError as exc:  # what a store says of a record it cannot read
        return Unreadable(key, _clipped(exc.message))


def describe(error: ValidationError) -> str:
    """What is wrong with a record, field by field, without the values it holds."""
    found = error.errors(include_url=False, include_context=False, include_input=False)
    parts = [
        f"{'.'.join(map(str, item['loc'])) or 'the record'}: {item['msg']}"
        for item in found[:NAMED_ERRORS]
    ]
    if len(found) > NAMED_ERRORS:
        parts.append(f"{len(found) - NAMED_ERRORS} more")
    return _clipped("; ".join(parts))


def _clipped(reason: str) -> str:
    if len(reason) <= MAX_REASON_CHARS:
        return reason
    return reason[: MAX_REASON_CHARS - 1] + "\u2026"
