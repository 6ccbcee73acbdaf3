"""A sandbox's supervisor that died before it wrote the program's exit status: rollway's own
machinery failed (killed from outside, by the OOM killer, a crash), not the program, so the
rollout is an infrastructure failure (retried, rerun by resume, never scored as the policy's).

The observable: the supervisor always writes the status file once the program's tree has ended
and then exits with a code of its own (``os._exit``); it never ends by a signal it sends itself.
So no status file, and

- local sandbox: the supervisor ended by a signal;
- namespace sandbox: ``unshare`` (the client's child) ended by a signal, or reported that its
  child (the supervisor, the namespaces' first process) did, in its own words (util-linux
  ``unshare`` cannot re-raise a SIGKILL on itself and exits 1 with ``unshare: sigprocmask
  unblock failed``): its last line of stderr starts with ``unshare:``. A program's own stderr
  never comes last without a status file: the supervisor writes the file after the program's
  whole tree has ended, and says so on stderr when it cannot.

A program that dies by a signal (its own SIGKILL, the CPU limit) is not this: the supervisor
outlives it and writes ``-9`` in the status file. The supervisor's orphans (the local sandbox's
program, re-parented when it died) are ended by its session (``session_members``): nothing
below it leaves the session but a process that calls ``setsid``, which the pids cgroup, where
there is one, ends too. In the namespace sandbox the kernel ends the whole PID namespace.
"""

from __future__ import annotations

import os
import signal

_UNSHARE_SAYS = "unshare:"


def local_death(returncode: int) -> str | None:
    """Why the local sandbox's supervisor, which ended with ``returncode`` and left no status
    file, died; None if it ended on its own (it could not write the file: the program's code
    stands)."""
    if returncode >= 0:
        return None
    return (
        f"the sandbox's supervisor (rollway's, not the program) was killed by"
        f" {_signal_name(-returncode)} before it wrote the program's exit status"
    )


def namespace_death(returncode: int, stderr: str) -> str | None:
    """Why the namespace sandbox's supervisor died, from ``unshare``'s end (``returncode``, the
    last line of ``stderr``) with no status file; None if it ended on its own."""
    if returncode < 0:
        return (
            f"the namespace sandbox's unshare was killed by {_signal_name(-returncode)},"
            " and its supervisor with it, before the program's exit status was written"
        )
    lines = stderr.rstrip().splitlines()
    if lines and lines[-1].startswith(_UNSHARE_SAYS):
        return (
            "the namespace sandbox's supervisor (rollway's, not the program) died before it"
            " wrote the program's exit status, as unshare reports"
        )
    return None


def session_members(session: int) -> list[int]:
    """The live processes of ``session`` (a dead supervisor's: it led its session), from a
    fresh look at ``/proc``. A session's id is never reused while a member lives."""
    members: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:  # ended meanwhile
            continue
        # "pid (comm) state ppid pgrp session ...": comm may hold anything.
        state, _, _, sid = stat[stat.rindex(")") + 2 :].split(maxsplit=4)[:4]
        if int(sid) == session and state not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
