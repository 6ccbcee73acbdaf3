"""A pids cgroup per sandbox, where this machine lets us make one. It bounds the number of
processes (``RLIMIT_NPROC`` does not bind root) and lists every process of the sandbox however
it forked or detached, so teardown can kill them all.

The leaf is made under this process's own cgroup: in cgroup v2 where that cgroup already
delegates the pids controller to its children, else in cgroup v1's pids hierarchy. Making one
needs write access there (root, or a delegated subtree); where there is none, ``create``
returns None and the sandbox relies on its supervisor and rlimits alone. A leaf is named for
its owner (``rollway-<owner token>-<hex>``, see ``rollway.tempdirs``), so that the empty leaves a
killed client left are removed by the next one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import uuid
from pathlib import Path

from rollway.tempdirs import PREFIX, is_abandoned, owner_token

log = logging.getLogger(__name__)

MOUNTS = Path("/proc/self/mounts")
OWN_CGROUPS = Path("/proc/self/cgroup")


def pids_parents() -> list[Path]:
    """This process's cgroup in each mounted hierarchy that has the pids controller."""
    own: dict[str, str] = {}  # "" (v2) or v1's comma-joined controllers -> path
    with contextlib.suppress(OSError):
        for line in OWN_CGROUPS.read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            own[controllers] = path.lstrip("/")
    parents = []
    for line in MOUNTS.read_text().splitlines():
        _, mount_point, fs_type, options, *_ = line.split()
        if fs_type == "cgroup2" and "" in own:
            parent = Path(mount_point) / own[""]
            with contextlib.suppress(OSError):  # delegated to children already: never changed
                if "pids" in (parent / "cgroup.subtree_control").read_text().split():
                    parents.append(parent)
        elif fs_type == "cgroup" and "pids" in options.split(","):
            key = next((k for k in own if "pids" in k.split(",")), None)
            if key is not None:
                parents.append(Path(mount_point) / own[key])
    return parents


class PidsCgroup:
    """One sandbox's leaf cgroup: joined by its first process, inherited by every descendant."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, max_pids: int | None) -> PidsCgroup | None:
        """A fresh leaf with ``pids.max`` set, or None where no hierarchy lets us make one."""
        name = f"{PREFIX}{owner_token()}-{uuid.uuid4().hex[:12]}"
        for parent in pids_parents():
            try:
                (parent / name).mkdir()
            except OSError:
                continue
            made = cls(parent / name)
            try:
                if max_pids is not None:
                    (made.path / "pids.max").write_text(str(max_pids))
            except OSError:
                made.remove()
                continue
            return made
        return None

    def join(self) -> None:
        """Move the calling process in (the sandbox's child, between fork and exec)."""
        with open(self.path / "cgroup.procs", "w") as procs:
            procs.write(str(os.getpid()))

    def kill(self) -> bool:
        """SIGKILL every process in it; whether there were any (call again until there are not:
        a process may fork between the listing and its kill)."""
        pids = [int(pid) for pid in (self.path / "cgroup.procs").read_text().split()]
        if not pids:
            return False
        kill_file = self.path / "cgroup.kill"  # cgroup v2, Linux 5.14+: all at once
        if kill_file.exists():
            kill_file.write_text("1")
            return True
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return True

    def remove(self) -> None:
        """Remove the (empty) cgroup; a failure is logged, never raised over a result."""
        try:
            self.path.rmdir()
        except FileNotFoundError:
            pass
        except OSError as error:
            log.warning("could not remove the sandbox's cgroup %s: %s", self.path, error)


def remove_abandoned_cgroups() -> list[Path]:
    """Remove the empty leaves whose owners have ended (a killed client's); those removed. One
    that still holds a process stays (rmdir refuses it): it is not ours to kill blindly."""
    removed = []
    for parent in pids_parents():
        with contextlib.suppress(OSError):
            for leaf in parent.iterdir():
                token = leaf.name.removeprefix(PREFIX).rpartition("-")[0]
                if leaf.name.startswith(PREFIX) and is_abandoned(token):
                    with contextlib.suppress(OSError):
                        leaf.rmdir()
                        removed.append(leaf)
    return removed
