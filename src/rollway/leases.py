"""Leases on an experiment: one live client at a time runs its rollouts.

Rollout ids and keys derive from the experiment id and the tasks, so two clients on the same
experiment (a client restarted while the old one still runs) register, cancel and unregister
each other's rollouts. A client therefore holds its experiment's lease in the store and, on a
shared gateway, at the gateway: it takes it when it starts, renews it every ``ttl_s / 6``
seconds (its heartbeat) and gives it back when it closes. Another client is refused with an
``ExperimentInUseError`` naming the holder (host, pid, start time) while the lease is live.

A lease lapses when its heartbeat is older than its ``ttl_s`` (at most 3600 s), or dated more
than its ``ttl_s`` ahead of the reader's clock, or at once when the holder's
process is seen gone from the holder's own machine (a client killed with SIGKILL: its restart
on the same host goes on without waiting). A pid alone could be reused, so the holder names its
process by pid and start time, on a machine named by its boot id and pid namespace.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from rollway.errors import ExperimentInUseError

#: How long a lease stays live without a heartbeat.
DEFAULT_TTL_S = 30.0


class LeaseHolder(BaseModel):
    """Who holds a lease: one client process."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    id: str = Field(min_length=1, max_length=64)
    host: str = Field(max_length=255)
    pid: int = Field(ge=0)
    #: When the client started (seconds since the epoch, before the year 10000).
    started_at: float = Field(ge=0, lt=253402300800)
    #: Where ``pid`` means this process (boot id and pid namespace); empty: unknown.
    machine: str = Field(default="", max_length=128)
    #: The process's start time as the kernel counts it (empty: unknown).
    process_start: str = Field(default="", max_length=32)

    @classmethod
    def this_process(cls) -> LeaseHolder:
        pid = os.getpid()
        return cls(
            id=uuid.uuid4().hex,
            host=socket.gethostname(),
            pid=pid,
            started_at=time.time(),
            machine=_MACHINE,
            process_start=_process_start(pid) or "",
        )

    def describe(self) -> str:
        started = datetime.fromtimestamp(self.started_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"pid {self.pid} on {self.host}, started {started} (client {self.id[:8]})"

    def is_gone(self) -> bool:
        """True only when the process is known to have ended: seen from its own machine,
        no such process (or a zombie, or another process under a reused pid)."""
        if not self.machine or self.machine != _MACHINE:
            return False
        start = _process_start(self.pid)
        return start is None or bool(self.process_start and start != self.process_start)


class Lease(BaseModel):
    """A holder's claim on an experiment, as the store and the gateway keep it."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    exp_id: str
    holder: LeaseHolder
    #: The last heartbeat (seconds since the epoch).
    renewed_at: float
    ttl_s: float = Field(gt=0, le=3600)

    def is_live(self, now: float | None = None) -> bool:
        """Renewed within its ttl of ``now``, on either side: a heartbeat up to ``ttl_s`` ahead
        is a holder whose clock runs ahead of this one. One further ahead (clocks apart by
        more than the ttl, a hand edit) is lapsed, so no lease stays live for longer than
        twice its ttl from the first look, whatever its clock says."""
        now = time.time() if now is None else now
        return abs(now - self.renewed_at) <= self.ttl_s and not self.holder.is_gone()

    def renewed(self) -> Lease:
        return self.model_copy(update={"renewed_at": time.time()})


def check_free(current: Lease | None, taker: LeaseHolder, where: str) -> None:
    """Refuse ``taker`` while ``current`` is another holder's live lease; ``where`` names the
    place that keeps it (the store's folder, the gateway's address)."""
    if current is None or current.holder.id == taker.id or not current.is_live():
        return
    raise ExperimentInUseError(
        f"experiment {current.exp_id!r} is in use by another client ({where}): "
        f"{current.holder.describe()}. Two clients on one experiment cancel each other's "
        "rollouts: wait for that client to end, stop it, or use another --exp-id. The lease of a "
        "client that was killed lapses once its process is gone (seen from its host) or "
        f"{current.ttl_s:g} s after its last heartbeat",
        param="exp_id",
    )


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _this_machine() -> str:
    """The kernel's boot id and this process's pid namespace: a pid means the same process
    to every process that shares both (a container has a namespace of its own)."""
    boot = _read("/proc/sys/kernel/random/boot_id")
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return ""
    return f"{boot}:{namespace}" if boot else ""


def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks after boot, or None when there is no
    such live process (or no ``/proc`` to tell: then the holder's machine is unknown too, and
    only the heartbeat decides)."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    fields = stat.rpartition(")")[2].split()  # the name before it may hold spaces
    return None if fields[0] in ("Z", "X") else fields[19]


_MACHINE = _this_machine()
