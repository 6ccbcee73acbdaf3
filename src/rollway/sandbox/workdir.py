"""A sandbox's working folder, held by a descriptor from the moment it is made.

The program owns what is in the folder, and in the local sandbox the folder's path too: it may
rename the folder and put a link to another folder in its place, and then whoever went by the
path would read and write that other folder. So the client reads the program's files, and the
supervisor writes its exit status, in the folder open as the descriptor (``dir_fd``), which a
rename or a swap cannot redirect; teardown removes the folder wherever it went, and what was
left at its path without following it. (In the namespace sandbox the folder is a mount point in
the program's view, which cannot be renamed; the descriptor serves there all the same.)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

from rollway.tempdirs import make_owned_tempdir

_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def make_workdir(prefix: str) -> tuple[Path, int]:
    """A fresh folder marked as the client's (``rollway.tempdirs``), and its descriptor."""
    path = make_owned_tempdir(prefix)
    try:
        return path, os.open(path, _FOLDER_FLAGS)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise


def remove_workdir(path: Path, fd: int) -> None:
    """Remove the folder open as ``fd`` wherever it is now, and whatever is at ``path`` (a link
    is removed, never followed); close ``fd``. Called once nothing of the program runs, so that
    nothing moves between a look and a removal. Like ``shutil.rmtree(ignore_errors=True)``,
    what cannot be removed is left."""
    try:
        with contextlib.suppress(OSError):
            _empty(fd)
        with contextlib.suppress(OSError):
            _remove_moved_folder(fd)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        _remove_path(path)


def _empty(fd: int) -> None:
    with os.scandir(fd) as entries:
        found = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]
    for name, is_dir in found:
        if is_dir:  # the descriptor-based rmtree: it follows no link inside either
            shutil.rmtree(name, dir_fd=fd, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=fd)


def _remove_moved_folder(fd: int) -> None:
    """The (empty) folder open as ``fd``, at the path the kernel knows it by now: removed if
    what is there is that very folder."""
    where = os.readlink(f"/proc/self/fd/{fd}")  # "... (deleted)" once gone: then no match
    held, found = os.fstat(fd), os.lstat(where)
    if stat.S_ISDIR(found.st_mode) and (found.st_dev, found.st_ino) == (
        held.st_dev,
        held.st_ino,
    ):
        os.rmdir(where)


def _remove_path(path: Path) -> None:
    """Whatever the program left at the folder's path: a link (never followed), a file, or a
    folder of its own (removed without following the links inside)."""
    if stat.S_ISDIR(path.lstat().st_mode):
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink()
