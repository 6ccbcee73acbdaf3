"""The file-system side of a namespace sandbox, run by its supervisor (the namespaces' first
process, root in its user namespace) before it starts the command: a fresh, empty tmpfs over each
place where programs find other programs' Unix sockets and shared memory (``/tmp``, ``/run``,
``/dev/shm``, ``/var/tmp``), with the paths the sandbox needs (its working directory, the
gateway's socket folder) bound back in at the same paths. Then the host's file system is
read-only, every mount of it, but for the working directory and any path the sandbox's limits
name as writable (``SandboxLimits.writable_paths``), each bound onto itself and made writable,
and the fresh tmpfs and ``/proc`` mounts (the namespaces' own).

The program must not undo that: it starts with an empty capability bounding set, so it holds no
capability in the user namespace (no ``umount`` nor remount, and no ``ptrace`` or ``/proc/1/fd``
of the supervisor, which still holds them); a user namespace of its own copies these mounts
locked together. The supervisor moves into the bound working directory, so the program's ``..``
is the fresh tmpfs, not the host's ``/tmp``.

Standard library only: the supervisor, run by path in isolated mode, loads it from beside itself.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Sequence
from errno import ENOSYS

_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC = 0x2, 0x4, 0x1000, 0x4000
_PR_CAPBSET_DROP = 24
# mount_setattr(2): the same number on every architecture (new system calls share one table).
_SYS_MOUNT_SETATTR, _AT_FDCWD, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = 442, -100, 0x8000, 1


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


def read_only(fresh: Sequence[str], writable: Sequence[str]) -> None:
    """Every mount read-only, but each of ``fresh`` (the fresh tmpfs and ``/proc`` mounts,
    which hold nothing of the host's) and each of ``writable`` (bound onto itself first, so
    that only it, and not the rest of its file system, becomes writable again). The mounts
    below a writable path stay read-only."""
    cwd = os.getcwd()
    _set_read_only("/", True, recursive=True)
    for place in fresh:
        if os.path.ismount(place):
            _set_read_only(place, False)
    for path in sorted(writable):  # a folder before any folder inside it
        _mount(path, path, None, _MS_BIND | _MS_REC, None)
        _set_read_only(path, False)
    os.chdir(cwd)  # by path again: the writable mount on top, not the read-only one below


def _set_read_only(path: str, on: bool, recursive: bool = False) -> None:
    """``mount_setattr`` (Linux 5.12): unlike a remount, it changes this one flag alone, and
    leaves the flags the user namespace locked (``nosuid``, ``nodev``...) as they are."""
    change = (_MOUNT_ATTR_RDONLY, 0) if on else (0, _MOUNT_ATTR_RDONLY)
    attr = ctypes.create_string_buffer(struct.pack("QQQQ", *change, 0, 0), 32)
    flags = _AT_RECURSIVE if recursive else 0
    libc = ctypes.CDLL(None, use_errno=True)
    args = (
        ctypes.c_long(_AT_FDCWD),
        path.encode(),
        ctypes.c_long(flags),
        attr,
        ctypes.c_size_t(32),
    )
    if libc.syscall(ctypes.c_long(_SYS_MOUNT_SETATTR), *args) != 0:
        errno = ctypes.get_errno()
        hint = " (it needs Linux 5.12 or later)" if errno == ENOSYS else ""
        raise OSError(errno, f"mount_setattr {path}: {os.strerror(errno)}{hint}")


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
