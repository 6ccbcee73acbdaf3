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
from typing import Any, NamedTuple

from rollway.errors import BadRecordError
from rollway.results import RolloutRecord
from rollway.store import Store
from rollway.store.file import FILE_FIELDS, record_key
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


class FileStamp(NamedTuple):
    """What an ``lstat`` of a record file says, without reading it. ``regular`` is False for a
    link (never followed), a folder, a FIFO: such an entry is never a record."""

    regular: bool
    size: int
    mtime_ns: int
    ctime_ns: int  # changes with a chmod too: a record made readable again is read again


def record_stamps(folder: Path) -> dict[str, FileStamp]:
    """The run ``folder``'s record files by key: one scandir and an ``lstat`` each (10,000
    records in tens of milliseconds, none read)."""
    found = {}
    with os.scandir(folder / "trajectories") as entries:
        for entry in entries:
            key = record_key(entry.name)
            if key is None:
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed since the scandir
            regular = stat.S_ISREG(info.st_mode)
            found[key] = FileStamp(regular, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    return found


def describes(row: dict[str, Any], stamp: FileStamp, index_mtime_ns: int) -> bool:
    """Whether the record file is still the one its index line ``row`` was written for, so the
    line can stand for it. A line carries the file's size and time as written (``FILE_FIELDS``):
    a file cut short, rewritten or replaced since differs. An older line carries neither: its
    file stands if it is no newer than the index (a record is in place before its line)."""
    if not stamp.regular:
        return False
    written = tuple(map(row.get, FILE_FIELDS))
    if written != (None, None):
        return written == (stamp.size, stamp.mtime_ns)
    return stamp.mtime_ns <= index_mtime_ns


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
