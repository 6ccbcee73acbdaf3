"""Reading what a store holds without trusting it: a record or a lease may have been cut short,
edited by hand, written by a newer rollway, or replaced by a link or a folder.

A record that cannot be read is a ``BadRecordError`` naming the file (or object) and why: its
readers report it and go on. A lease that cannot be read is a ``StoredDataError`` naming the
file and the fix. Neither message quotes the bytes read: a link's target could be anything.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from rollway.errors import BadRecordError, StoredDataError
from rollway.leases import Lease
from rollway.results import RolloutRecord

#: The validation errors a reason names, of those pydantic found.
_REASONS = 3


def read_file(path: Path) -> bytes | None:
    """The bytes of the regular file at ``path``, None where there is none. A link is never
    followed, and anything but a regular file (a folder, a FIFO) is refused: ``ValueError``
    saying what it is."""
    try:
        # O_NONBLOCK: opening a FIFO to read would wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError("a symbolic link, which rollway does not follow") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError("a folder" if stat.S_ISDIR(mode) else "not a regular file")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as file:
        return file.read()


def parse_record(data: bytes, where: str, key: str | None) -> RolloutRecord:
    """The record in ``data``; a ``BadRecordError`` naming ``where`` when it is none."""
    try:
        return RolloutRecord.model_validate_json(data)
    except ValidationError as exc:
        raise BadRecordError.of(where, validation_reason(exc), key) from None


def read_record(path: Path, key: str) -> RolloutRecord | None:
    """The record in the file at ``path`` (None: no such file); a ``BadRecordError`` naming
    the file when it is not a record (or not a file)."""
    try:
        data = read_file(path)
    except ValueError as exc:
        raise BadRecordError.of(str(path), str(exc), key) from None
    return None if data is None else parse_record(data, str(path), key)


def summary_of(data: bytes | None) -> dict[str, Any] | None:
    """The summary in ``data``: a JSON object, else None (a summary is rewritten, never
    trusted: one cut short or edited is as good as none)."""
    try:
        summary = None if data is None else orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return summary if isinstance(summary, dict) else None


def parse_lease(data: bytes, where: str) -> Lease:
    """The lease in ``data``; a ``StoredDataError`` naming ``where`` and the fix."""
    try:
        return Lease.model_validate_json(data)
    except ValidationError as exc:
        raise bad_lease(where, validation_reason(exc)) from None


def bad_lease(where: str, reason: str) -> StoredDataError:
    return StoredDataError(
        f"the experiment's lease {where} cannot be read ({reason}): remove {where} if no run "
        "holds the experiment (a running client writes it anew at its next heartbeat)",
        "lease",
    )


def validation_reason(exc: ValidationError) -> str:
    """What pydantic found wrong, by field, without the input it quotes."""
    found = exc.errors(include_url=False, include_input=False, include_context=False)
    parts = []
    for error in found[:_REASONS]:
        field = ".".join(str(part) for part in error["loc"])
        parts.append(f"{field}: {error['msg']}" if field else str(error["msg"]))
    more = len(found) - _REASONS
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")
