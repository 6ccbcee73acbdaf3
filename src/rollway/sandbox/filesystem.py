"""The file-system side of a namespace sandbox, run by its supervisor (the namespaces' first
process, root in its user namespace) before it starts the command: a fresh, empty tmpfs over each
place where programs find other programs' Unix sockets and shared memory (``/tmp``, ``/run``,
``/dev/shm``, ``/var/tmp``), with the paths the sandbox needs (its working directory, the
gateway's socket folder) bound back in at the same paths.

The program must not undo that: it starts with an empty capability bounding set, so it holds no
capability in the user namespace (no ``umount``, and no ``ptrace`` or ``/proc/1/fd`` of the
supervisor, which still holds them); a user namespace of its own copies these mounts locked
together. The supervisor moves into the bound working directory, so the program's ``..`` is the
fresh tmpfs, not the host's ``/tmp``.

Standard library only: the supervisor, run by path in isolated mode, loads it from beside itself.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence

_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC = 0x2, 0x4, 0x1000, 0x4000
_PR_CAPBSET_DROP = 24


def _mount(source: str, target: str, fs_type: str | None, flags: int, data: str | None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    encoded = [None if s is None else s.encode() for s in (source, target, fs_type, data)]
    if libc.mount(encoded[0], encoded[1], encoded[2], ctypes.c_ulong(flags), encoded[3]) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def hide(places: Sequence[str], keep: Sequence[str], size: int | None) -> None:
    """A fresh tmpfs (of at most ``size`` bytes: it is memory) over each existing directory of
    ``places``; then each directory of ``keep`` that this hid bound back at its path (opened
    first: afterwards its path leads into the new tmpfs)."""
    options = "mode=1777" + (f",size={size}" if size is not None else "")
    cwd = os.getcwd()
    kept = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in keep}
    try:
        for place in places:
            if os.path.isdir(place) and not os.path.islink(place):
                _mount("tmpfs", place, "tmpfs", _MS_NOSUID | _MS_NODEV, options)
        for path, fd in kept.items():
            if not os.path.isdir(path):  # hidden by the above: bring it back
                os.makedirs(path)
                _mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC, None)
    finally:
        for fd in kept.values():
            os.close(fd)
    os.chdir(cwd)  # by path again: the folder bound back, not the hidden one


def drop_capability_bounding_set() -> None:
    """Empty this thread's bounding set: the commands it starts (as root in the user namespace)
    then hold no capability, and cannot unmount what ``hide`` mounted."""
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in range(last + 1):
        if libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"prctl(PR_CAPBSET_DROP): {os.strerror(errno)}")
