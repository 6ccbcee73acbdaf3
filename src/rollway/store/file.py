"""``file://`` store: one folder per experiment.

    <root>/<exp_id>/config.json                 the run's config
    <root>/<exp_id>/trajectories/<key>.json     one record per rollout (written atomically)
    <root>/<exp_id>/index.jsonl                 one line per write: key, status, reward,
                                                what a listing shows (``index_row``) and the
                                                record file as written (``FILE_FIELDS``)
    <root>/<exp_id>/<name>.json                 summaries (groups, run)
    <root>/<exp_id>/debug/<rollout_id>.jsonl    per-rollout debug events, when enabled
    <root>/<exp_id>/agent-reports/<run_key>.json  what remote agent servers reported
    <root>/<exp_id>/lease.json                  the client running the experiment now
                                                (``rollway.leases``), taken under a flock
                                                of ``.lease.lock``

The trajectory files are the source of truth. The index is a fast listing, appended to on
every write (appends need no lock among workers): a rollout written again (rerun after a cancel
or an infrastructure failure, requeued on Ray) has a line per write, the last one current.
Read it with ``read_index``, which takes the last line per key and skips a line torn by a
writer that was killed.

Each file is written to a hidden ``.<name>.<random>.tmp`` sibling, under an exclusive
``flock`` until it is renamed into place; opening a store removes the temporary files no live
writer holds (a writer killed mid-write). Files get the permissions the umask gives.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from rollway.errors import ConfigError, StoredDataError
from rollway.leases import Lease, LeaseHolder, check_free
from rollway.results import AgentReport, RolloutRecord, Status
from rollway.store.base import OnBadRecord, each_record
from rollway.store.reading import (
    bad_lease,
    parse_lease,
    parse_summary,
    read_file,
    read_record,
)

log = logging.getLogger(__name__)
_SAFE_KEY = re.compile(r"^[A-Za-z0-9._-]+$")
INDEX = "index.jsonl"
#: An index line's fields that describe its record file as written: its size in bytes and its
#: modification time. A reader compares them with the file's ``lstat`` to tell a record changed
#: since (cut short, rewritten, replaced) from the one the line describes, without reading it.
FILE_FIELDS = ("bytes", "mtime_ns")
#: The longest error reason an index line keeps (a program agent's carries its stderr's tail).
INDEX_REASON_CHARS = 300


def check_name(name: str, what: str) -> None:
    """Experiment ids and rollout keys become file and object names: keep them plain."""
    if not _SAFE_KEY.match(name) or name in (".", ".."):
        raise ConfigError(f"{what} {name!r} may hold only letters, digits, . _ -")


class FileStore:
    def __init__(self, root: str | Path, exp_id: str) -> None:
        check_name(exp_id, "experiment id")
        self.exp_id = exp_id
        self.path = Path(root).absolute() / exp_id  # the same folder from any worker
        self._trajectories = self.path / "trajectories"
        self._trajectories.mkdir(parents=True, exist_ok=True)
        self.debug_dir: Path | None = self.path / "debug"
        self._index = self.path / INDEX
        for folder in (self.path, self._trajectories, self.path / "agent-reports"):
            _remove_abandoned(folder)
        _end_torn_line(self._index)

    def write_config(self, config: dict[str, Any]) -> None:
        _atomic_write(self.path / "config.json", orjson.dumps(config, option=orjson.OPT_INDENT_2))

    def write(self, record: RolloutRecord) -> None:
        written = _atomic_write(self._record_path(record.rollout_key), record.stored())
        row = {**index_row(record), "bytes": written.st_size, "mtime_ns": written.st_mtime_ns}
        with _named_in_errors(self._index), self._index.open("ab") as index:
            index.write(orjson.dumps(row) + b"\n")

    def exists(self, rollout_key: str) -> bool:
        return self._record_path(rollout_key).is_file()

    def get(self, rollout_key: str) -> RolloutRecord | None:
        return read_record(self._record_path(rollout_key), rollout_key)

    def keys(self) -> set[str]:
        # scandir, not glob: no Path per entry (10,000 records list in milliseconds).
        with os.scandir(self._trajectories) as entries:
            return {key for entry in entries if (key := record_key(entry.name)) is not None}

    def records(self, on_bad: OnBadRecord | None = None) -> Iterator[RolloutRecord]:
        return each_record(self, on_bad)

    def write_summary(self, name: str, data: dict[str, Any]) -> None:
        payload = orjson.dumps(data, option=orjson.OPT_INDENT_2)
        _atomic_write(self.path / f"{name}.json", payload)

    def read_summary(self, name: str) -> dict[str, Any] | None:
        check_name(name, "summary name")
        path = self.path / f"{name}.json"
        data = read_file(path)
        return None if data is None else parse_summary(data, str(path))

    def write_report(self, report: AgentReport) -> None:
        path = self._report_path(report.run_key)
        path.parent.mkdir(exist_ok=True)
        _atomic_write(path, report.model_dump_json().encode())

    def report_exists(self, run_key: str) -> bool:
        return self._report_path(run_key).is_file()

    def get_report(self, run_key: str) -> AgentReport | None:
        path = self._report_path(run_key)
        if not path.is_file():
            return None
        return AgentReport.model_validate_json(path.read_bytes())

    def take_lease(self, lease: Lease) -> None:
        with self._lease_lock():
            check_free(self._current_lease(), lease.holder, f"lease at {self._lease}")
            _atomic_write(self._lease, lease.model_dump_json().encode())

    def release_lease(self, holder: LeaseHolder) -> None:
        with self._lease_lock():
            current = self._current_lease()
            if current is not None and current.holder.id == holder.id:
                self._lease.unlink(missing_ok=True)

    @property
    def _lease(self) -> Path:
        return self.path / "lease.json"

    def _current_lease(self) -> Lease | None:
        try:
            data = read_file(self._lease)
        except ValueError as exc:
            raise bad_lease(str(self._lease), str(exc)) from None
        return None if data is None else parse_lease(data, str(self._lease))

    @contextmanager
    def _lease_lock(self) -> Iterator[None]:
        """Read, decide and write the lease as one step among clients (held for milliseconds;
        the flock goes with the process, so a killed client leaves nothing locked)."""
        path = self.path / ".lease.lock"
        with _named_in_errors(path):
            lock = os.fdopen(_open_lock_file(path), "ab")
        with lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            yield

    def _report_path(self, run_key: str) -> Path:
        check_name(run_key, "run key")
        return self.path / "agent-reports" / f"{run_key}.json"

    def _record_path(self, rollout_key: str) -> Path:
        check_name(rollout_key, "rollout key")
        return self._trajectories / f"{rollout_key}.json"


def record_key(name: str) -> str | None:
    """The rollout key of the file ``name`` in ``trajectories/``; None for one that is no
    record (a writer's hidden temporary file, anything not ``.json``)."""
    return name[:-5] if name.endswith(".json") and not name.startswith(".") else None


def index_row(record: RolloutRecord) -> dict[str, Any]:
    """A record's index line: what a listing of the run shows (``rollway view``), so that
    listing 10,000 rollouts reads one file instead of 10,000 trajectories."""
    turns = tokens = None
    if record.trajectory is not None:
        turns = len(record.trajectory.turns)
        if record.trajectory.has_token_ids:
            tokens = sum(len(turn.completion_ids) for turn in record.trajectory.turns)
    elif record.trajectory_stats is not None:
        turns, tokens = record.trajectory_stats.turns, record.trajectory_stats.sampled_tokens
    reason = record.reason
    if reason is not None and len(reason) > INDEX_REASON_CHARS:
        reason = reason[: INDEX_REASON_CHARS - 1] + "\u2026"
    return {
        "key": record.rollout_key,
        "status": record.status,
        "reward": record.reward,
        "rollout_id": record.rollout_id,
        "group_id": record.group_id,
        "task_index": record.task_index,
        "sample_index": record.sample_index,
        "error_kind": record.error_kind,
        "reason": reason,
        "attempts": record.attempts,
        "started_at": record.started_at,
        "elapsed_s": record.elapsed_s,
        "turns": turns,
        "sampled_tokens": tokens,
        "policy_version": record.policy_version,
        "reward_components": record.reward_components,
    }


@dataclass(frozen=True, slots=True)
class IndexEntry:
    key: str
    status: Status
    reward: float | None
    #: The whole line (``index_row``'s fields and ``FILE_FIELDS``; fewer in older runs' indexes).
    row: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


def read_index(exp_dir: str | Path) -> dict[str, IndexEntry]:
    """The index of the experiment folder ``exp_dir``: the last line per key (a key written
    several times has several lines), keys in the order first written; torn lines skipped."""
    path = Path(exp_dir) / INDEX
    if not path.is_file():
        return {}
    entries: dict[str, IndexEntry] = {}
    for line in path.read_bytes().splitlines():
        try:
            row = orjson.loads(line)
            entry = IndexEntry(row["key"], row["status"], row["reward"], row)
        except (orjson.JSONDecodeError, KeyError, TypeError):
            continue  # torn by a writer that was killed mid-line
        entries[entry.key] = entry
    return entries


def _atomic_write(path: Path, data: bytes) -> os.stat_result:
    """Write a locked temporary sibling, flush it to disk, then rename it over ``path``; the
    file's status as written (a rename keeps its size and modification time)."""
    fd, tmp = _locked_tmp(path)
    try:
        with _named_in_errors(path), os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
            written = os.fstat(out.fileno())
            _set_aside_folder(path)
            os.replace(tmp, path)  # before the lock goes with the file's closing
        return written
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _set_aside_folder(path: Path) -> None:
    """A folder where a file is to go (a hand edit, a bad restore) is renamed aside under a
    dot name, which listings skip: kept, never deleted, and no longer blocking the write."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return
    except FileNotFoundError:
        return
    aside = path.with_name(f".{path.name}.folder-{secrets.token_hex(4)}")
    os.rename(path, aside)
    log.warning("%s was a folder: moved aside to %s to write the file", path, aside)


def _locked_tmp(path: Path) -> tuple[int, Path]:
    """A new temporary sibling of ``path``, open for writing, under an exclusive flock."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        with _named_in_errors(path):
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.fstat(fd).st_nlink:
            return fd, tmp
        # A store opening between our open and our lock took the file for abandoned.
        os.close(fd)


def _remove_abandoned(folder: Path) -> None:
    """Remove temporary files whose writer died: a live writer holds its file's flock."""
    for tmp in folder.glob(".*.tmp"):
        try:
            fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue  # renamed into place meanwhile
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            tmp.unlink(missing_ok=True)
        except BlockingIOError:
            pass  # a live writer
        except OSError as exc:
            if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise  # a read-only copy stays as it is: whoever reads it need not tidy it
        finally:
            os.close(fd)


def _end_torn_line(index: Path) -> None:
    """A writer killed mid-line left no newline: end that line, so the next entry stands alone."""
    if not index.is_file() or index.stat().st_size == 0:
        return
    with index.open("rb") as file:
        file.seek(-1, os.SEEK_END)
        torn = file.read(1) != b"\n"
    if torn:
        with index.open("ab") as file:
            file.write(b"\n")


def _open_lock_file(path: Path) -> int:
    """``path`` opened to lock, made if missing; anything but a regular file there is refused
    naming it. O_NONBLOCK: opening a FIFO to write would wait for a reader, forever."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        if exc.errno != errno.ENXIO:  # ENXIO: a FIFO that no one reads
            raise
        raise _not_a_lock_file(path, "a FIFO") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _not_a_lock_file(path, "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file")
    return fd


def _not_a_lock_file(path: Path, what: str) -> StoredDataError:
    return StoredDataError(
        f"the experiment's lease lock {path} is {what}, not the empty file rollway locks: "
        "remove it (rollway makes it anew)",
        "lease",
    )


@contextmanager
def _named_in_errors(path: Path) -> Iterator[None]:
    """Name ``path`` in OS errors that name no file (a failed write, a full disk) or only our
    temporary file: the user needs to see where the store could not write."""
    try:
        yield
    except OSError as exc:
        if exc.errno is not None:
            exc.filename = str(path)
        raise
