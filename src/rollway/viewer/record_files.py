"""The viewer's reading of a run's files, one at a time and tolerant of bad ones.

A record that does not read (not JSON, a format this rollway does not know, a field missing or
of the wrong type, a JSON list, a symbolic link, a folder) is an ``Unreadable`` with its reason,
so one bad record never takes the listing or the other rollouts' pages down. A reason never
quotes the file: a link is not followed at all (it could point at any file on the machine), and
a validation error is told by its fields and messages, never by the input it met.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path

from rollway.errors import BadRecordError
from rollway.results import RolloutRecord
from rollway.store import Store
from rollway.store.reading import read_file

#: The longest reason kept (a record with many bad fields: its first errors).
MAX_REASON_CHARS = 300


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A run's record that the viewer cannot show, and why (never its content)."""

    key: str
    reason: str

    def as_row(self) -> dict[str, str]:
        return {"key": self.key, "reason": self.reason}


def read_plain_file(path: Path) -> bytes:
    """The bytes of ``path`` if it is a regular file, read as the stores read a record (a link
    at its end is never followed, a FIFO never waited on). FileNotFoundError where there is
    none; any other OSError's ``strerror`` says why it was not read."""
    try:
        data = read_file(path)
    except ValueError as exc:
        raise OSError(errno.EINVAL, str(exc), str(path)) from None
    if data is None:
        raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
    return data


def load_record(store: Store, key: str) -> RolloutRecord | Unreadable | None:
    """The run's record ``key`` as its store reads it; None where there is none."""
    try:
        return store.get(key)
    except BadRecordError as exc:
        return Unreadable(key, _clipped(exc.reason))
    except OSError as exc:
        return Unreadable(key, _clipped(exc.strerror or type(exc).__name__))


def _clipped(reason: str) -> str:
    if len(reason) <= MAX_REASON_CHARS:
        return reason
    return reason[: MAX_REASON_CHARS - 1] + "\u2026"
