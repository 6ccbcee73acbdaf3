"""Reading back a file a sandboxed program left: never through a link, only a regular file, and
at most a given number of bytes.

The program decides what is at the path: a FIFO blocks an open (and a read) for good, a link to
``/dev/zero`` never ends, and a link elsewhere reads what the client may read. So the open
follows no link (``O_NOFOLLOW``) and cannot block (``O_NONBLOCK``), what it opened must be a
regular file (``fstat``), and one byte past ``limit`` is the most ever read. The program may also
rename its folder and put a link to another folder in its place: a sandbox opens the file in
its folder's descriptor (``dir_fd``), held since it made the folder, never by the folder's path.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from rollway.errors import AgentError

_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def read_back(
    path: Path, limit: int, what: str, setting: str = "", *, dir_fd: int | None = None
) -> bytes | None:
    """The bytes of the regular file ``path``, None if there is none. An ``AgentError`` naming
    ``what`` if it is a link or not a regular file, or holds more than ``limit`` bytes (the
    ``setting`` that says so, if any). With ``dir_fd``, the file named ``path.name`` in the
    folder open as ``dir_fd`` (``path`` then only names it in errors)."""
    try:
        fd = os.open(path if dir_fd is None else path.name, _FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise AgentError(f"the program's {what} {path} is a symbolic link") from None
        raise AgentError(f"cannot open the program's {what} {path}: {error.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
            raise AgentError(f"the program's {what} {path} is {kind}, not a regular file")
        data = _read_at_most(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        where = f" ({setting})" if setting else ""
        raise AgentError(f"the program's {what} {path} is over its limit of {limit} bytes{where}")
    return data


_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFDIR: "a directory",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def _read_at_most(fd: int, size: int) -> bytes:
    chunks: list[bytes] = []
    left = size
    while left > 0 and (chunk := os.read(fd, min(left, 1024 * 1024))):
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
