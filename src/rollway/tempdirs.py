"""Temporary folders that say whose they are, so that what a killed process left behind is
found and removed by the next one, and nothing of a live process, or of anyone else, is touched.

A folder made by ``make_owned_tempdir`` is named ``rollway-...`` and holds ``.rollway-owner``
with an owner token: the maker's pid namespace (a pid means nothing in another), pid and start
time (pids are reused). ``remove_abandoned_tempdirs`` removes such a folder of the temp dir only
when it is a real directory of this user and its owner, seen from this pid namespace, has ended.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "rollway-"
OWNER_FILE = ".rollway-owner"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot; None if it has ended (zombies
    included: a zombie holds nothing any more)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat_line = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # "pid (comm) state ppid ...": comm may hold anything, so split after its last ")".
    fields = stat_line[stat_line.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def _pid_namespace() -> str:
    return str(os.stat("/proc/self/ns/pid").st_ino)


def owner_token(pid: int | None = None) -> str:
    """``<pid namespace>.<pid>.<start time>`` of ``pid`` (this process by default)."""
    pid = os.getpid() if pid is None else pid
    return f"{_pid_namespace()}.{pid}.{_start_time(pid)}"


def is_abandoned(token: str) -> bool:
    """Whether the owner named by ``token`` has ended. A token from another pid namespace,
    or one that does not parse, is never abandoned: we cannot tell, so it is not ours."""
    parts = token.strip().split(".")
    if len(parts) != 3 or not parts[1].isdigit() or parts[0] != _pid_namespace():
        return False
    return _start_time(int(parts[1])) != parts[2]


def make_owned_tempdir(prefix: str) -> Path:
    """A fresh folder in the temp dir (``prefix`` starts with ``rollway-``), marked as ours."""
    assert prefix.startswith(PREFIX)
    path = Path(tempfile.mkdtemp(prefix=prefix))
    (path / OWNER_FILE).write_text(owner_token())
    return path


def remove_abandoned_tempdirs(root: Path | None = None) -> list[Path]:
    """Remove the marked folders under ``root`` (the temp dir) whose owners have ended; the
    folders removed. Never raises: a folder that cannot be read or removed is left as it is."""
    removed = []
    root = Path(tempfile.gettempdir()) if root is None else root
    with contextlib.suppress(OSError), os.scandir(root) as entries:
        for entry in entries:
            if entry.name.startswith(PREFIX) and _is_abandoned_folder(Path(entry.path)):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(Path(entry.path))
    if removed:
        log.info("removed %d folders left by ended rollway processes", len(removed))
    return removed


def _is_abandoned_folder(path: Path) -> bool:
    """A directory (not a link to one) of this user, whose owner file names an ended owner."""
    try:
        info = path.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            return False
        owner = path / OWNER_FILE
        if not stat.S_ISREG(owner.lstat().st_mode):
            return False
        return is_abandoned(owner.read_text(errors="replace")[:100])
    except OSError:
        return False
