"""The first process of every sandbox's command: a child subreaper that runs the command and,
when it ends (or on SIGTERM/SIGINT), ends every process below it before it exits itself.

    python -I -S supervisor.py --status NAME --workdir-fd DIR_FD --grace SECONDS [--lifeline FD]
        [--relay [--port P --unix S]]
        [--hide DIR ... --keep DIR ... [--tmpfs-size B] --writable PATH ...]
        -- COMMAND ...

As a subreaper it inherits every orphan below it (a double-forked daemon, a ``setsid`` child)
instead of init, so it finds every descendant however it detached, and reaps them as they end.
At the end it sends each descendant SIGTERM, gives them the grace period, SIGKILLs what is left
and exits only once none is alive: whatever held the sandbox's output pipes is gone with it. The
command runs in a process group of its own, so each descendant gets one SIGTERM (this one's)
however the sandbox was signalled. The command's exit code (negative: the signal that killed it)
is left in the file NAME of the folder open as DIR_FD (the sandbox's working folder, opened by
the client when it made it: the command may have renamed the folder, or put a link in its place,
and the status still lands in that folder, never in one the link leads to). In a namespace
sandbox it is the namespaces' first process and, with ``--relay``, also runs ``relay.py``
(loopback up, ``127.0.0.1:P`` relayed to the socket S), and with ``--hide``, ``filesystem.py``
(a fresh tmpfs over each DIR, each kept DIR bound back, all read-only but those fresh mounts and
each PATH).

Its life is tied to the client's: FD is the read end of a pipe whose write end only the client
holds, so its end of file means the client is gone (killed, however): that is a SIGTERM, and the
sandbox ends as it would on a teardown.

Standard library only, run by path in isolated mode: nothing in the program's environment
(``PYTHONPATH``...) changes how it runs, and it starts in milliseconds.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib.util
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

_PR_SET_CHILD_SUBREAPER = 36
_SIGNALS = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT}
_POLL_S = 0.05


def become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def process_stats() -> Iterator[tuple[int, list[str]]]:
    """Each live-or-zombie process's pid and the fields of its ``/proc/PID/stat`` after its
    name ("state ppid pgrp session ..."), from a fresh look at ``/proc``."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:  # ended meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold anything, so split after its last ")".
        yield int(entry.name), stat[stat.rindex(")") + 2 :].split(maxsplit=4)


def descendants() -> list[int]:
    """Every live process below this one, from a fresh look at ``/proc``."""
    children: dict[int, list[int]] = {}
    alive: set[int] = set()
    for pid, fields in process_stats():
        state, ppid = fields[:2]
        children.setdefault(int(ppid), []).append(pid)
        if state not in ("Z", "X"):
            alive.add(pid)
    found: list[int] = []
    stack = [os.getpid()]
    while stack:
        for child in children.get(stack.pop(), []):
            stack.append(child)
            if child in alive:
                found.append(child)
    return found


def send(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def reap(main: int | None = None) -> int | None:
    """Reap every child that has ended; ``main``'s exit code if it was among them."""
    code = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return code
        if pid == 0:
            return code
        if pid == main:
            code = os.waitstatus_to_exitcode(status)


def given_environment() -> dict[bytes, bytes]:
    """The environment exactly as this process was given it: ``os.environ`` has gained what
    Python set for itself at start-up (``LC_CTYPE``, coercing a C locale)."""
    with open("/proc/self/environ", "rb") as f:
        entries = f.read().split(b"\0")
    return dict(entry.split(b"=", 1) for entry in entries if b"=" in entry)


def spawn(command: Sequence[str]) -> int:
    return os.posix_spawnp(
        command[0],
        list(command),
        given_environment(),
        setpgroup=0,
        setsigmask=(),  # unblock what this process blocks
        setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),  # which Python ignores; exec keeps ignores
    )


def wait_for_command(main: int, grace: float) -> tuple[int, float | None]:
    """``main``'s exit code, and the deadline a SIGTERM set (None if none came)."""
    code: int | None = None
    deadline: float | None = None
    killed = False
    info: signal.struct_siginfo | None
    while code is None:
        if deadline is None or killed:
            info = signal.sigwaitinfo(_SIGNALS)
        else:
            info = signal.sigtimedwait(_SIGNALS, max(deadline - time.monotonic(), 0))
        if info is None:  # the grace period is over
            send(descendants(), signal.SIGKILL)
            killed = True
        elif info.si_signo == signal.SIGCHLD:
            code = reap(main)
        elif deadline is None:  # the first SIGTERM or SIGINT: pass it on to every descendant
            send(descendants(), info.si_signo)
            deadline = time.monotonic() + grace
    return code, deadline


def end_descendants(deadline: float, signalled: bool) -> None:
    """SIGTERM the rest (unless already done), SIGKILL whatever outlives ``deadline``."""
    left = descendants()
    if not signalled:
        send(left, signal.SIGTERM)
    while left:
        if time.monotonic() >= deadline:
            send(left, signal.SIGKILL)
        # Only orphans' ends are signalled to us, not their children's: look again soon.
        signal.sigtimedwait({signal.SIGCHLD}, _POLL_S)
        reap()
        left = descendants()
    reap()


def load_sibling(name: str) -> ModuleType:
    """``<name>.py`` from beside this file (run by path in isolated mode, there is no package
    to import it from)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def watch_lifeline(fd: int) -> None:
    """SIGTERM this process when the pipe ``fd`` reaches its end (the client died). Kept from
    the command. The signal is blocked in every thread, so it waits for ``sigwaitinfo``."""
    os.set_inheritable(fd, False)

    def watch() -> None:
        while os.read(fd, 1):  # nobody writes: only the end of file comes
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True).start()


def supervise(command: Sequence[str], grace: float) -> int:
    """Run ``command`` to its end and end every descendant; its exit code. ``_SIGNALS`` must
    be blocked."""
    become_subreaper()
    try:
        main = spawn(command)
    except OSError as error:
        print(f"rollway sandbox: cannot run {command[0]!r}: {error.strerror}", file=sys.stderr)
        return 126 if isinstance(error, PermissionError) else 127
    code, deadline = wait_for_command(main, grace)
    end_descendants(deadline or time.monotonic() + grace, signalled=deadline is not None)
    return code


def write_status(folder: int, name: str, code: int) -> None:
    """``code`` in a new regular file ``name`` of the folder open as ``folder``: whatever the
    command left there (a FIFO would block the open for good, a link would be followed) is
    removed first. Nothing of the command runs any more to put it back. Unwritable, the client
    takes this process's own."""
    with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
        os.unlink(name, dir_fd=folder)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    try:
        fd = os.open(name, flags, 0o600, dir_fd=folder)
    except OSError as error:
        print(f"rollway sandbox: cannot write {name}: {error.strerror}", file=sys.stderr)
        return
    with os.fdopen(fd, "w") as out:
        out.write(str(code))


def prepare_namespaces(args: argparse.Namespace) -> None:
    """In a namespace sandbox, before the command: its file-system view, then the relay."""
    if args.hide:
        filesystem = load_sibling("filesystem")
        filesystem.hide(args.hide, args.keep, args.tmpfs_size)
        filesystem.read_only([*args.hide, "/proc"], args.writable)
        filesystem.drop_capability_bounding_set()
    if args.relay:
        load_sibling("relay").start(args.port, args.unix)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="supervisor.py")
    parser.add_argument("--status", required=True, help="a file name in --workdir-fd")
    parser.add_argument("--workdir-fd", type=int, required=True, help="the sandbox's folder")
    parser.add_argument("--grace", type=float, default=2.0)
    parser.add_argument("--relay", action="store_true", help="in a new network namespace")
    parser.add_argument("--port", type=int)
    parser.add_argument("--unix")
    parser.add_argument("--lifeline", type=int, help="a pipe's read end: its end is ours")
    parser.add_argument("--hide", action="append", default=[], help="a fresh tmpfs over it")
    parser.add_argument("--keep", action="append", default=[], help="bound back if hidden")
    parser.add_argument("--tmpfs-size", type=int, help="bytes, for each tmpfs over a --hide")
    parser.add_argument(
        "--writable", action="append", default=[], help="with --hide: writable, the rest not"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    # Taken with sigwaitinfo, in order (the relay's thread inherits the mask, so they come to
    # it alone). Blocked, they also stay pending where this is the namespaces' first process,
    # which would drop a signal it has no handler for.
    signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    os.set_inheritable(args.workdir_fd, False)  # the supervisor's, not the command's
    if args.lifeline is not None:
        watch_lifeline(args.lifeline)
    try:
        prepare_namespaces(args)
    except OSError as error:  # never run the command less isolated than asked
        print(f"rollway sandbox: cannot isolate: {error}", file=sys.stderr)
        os._exit(125)
    code = supervise(command, args.grace)
    write_status(args.workdir_fd, args.status, code)
    sys.stderr.flush()
    os._exit(code if code >= 0 else 128 - code)  # not waiting for the relay's thread


if __name__ == "__main__":
    main()
