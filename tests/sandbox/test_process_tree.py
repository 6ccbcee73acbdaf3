"""The whole process tree of a sandbox, however it forks: the sandbox waits for the program and
not for its pipes, kills every descendant at teardown (daemons that ``setsid`` too), and bounds
the number of processes even for root. Each kind runs with and without a pids cgroup."""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest

from rollway.sandbox import LocalSandbox, NamespaceSandbox, SandboxLimits, cgroup, local_sandbox
from rollway.sandbox.base import Sandbox

from .test_local import ENV, PY, is_gone

MakeSandbox = Callable[[SandboxLimits], Sandbox]


@pytest.fixture(params=["local", "local-without-cgroup", "namespace", "namespace-without-cgroup"])
def make(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> MakeSandbox:
    """Each sandbox kind, with a pids cgroup where this machine allows one and without."""
    if request.param.endswith("-without-cgroup"):
        monkeypatch.setattr(cgroup, "MOUNTS", Path("/dev/null"))  # no cgroup file system
    return NamespaceSandbox if request.param.startswith("namespace") else LocalSandbox


def lock_is_free(lock: IO[str]) -> bool:
    """Whether no process holds an exclusive ``flock`` on the open file ``lock`` any more."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


async def test_the_sandbox_waits_for_the_program_not_for_its_background_children(
    make: MakeSandbox,
) -> None:
    async with make(SandboxLimits(wall_timeout_s=10)) as box:
        await box.start(["sh", "-c", "sleep 30 & echo $!; exit 0"], ENV)
        result = await box.wait()
    assert result.exit_code == 0 and not result.timed_out and result.wall_s < 5
    if make is LocalSandbox:  # a pid of this machine (a namespace numbers its own)
        assert is_gone(int(result.stdout))


# A double fork and setsid: a daemon in a session of its own, stdio on /dev/null (so it holds
# no pipe of the sandbox), holding a lock on LOCK and its pid in PIDFILE while it lives.
DAEMON = """
import fcntl, os, sys, time
lock_path, pid_path, then = sys.argv[1:]
ready_r, ready_w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        lock = open(lock_path, "w")
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(pid_path, "w") as f:
            f.write(str(os.getpid()))
        os.write(ready_w, b"x")
        time.sleep(60)
    os._exit(0)
os.read(ready_r, 1)
if then == "hang":
    time.sleep(60)
"""


@pytest.mark.parametrize("then", ["exit", "hang"])
async def test_a_detached_daemon_does_not_survive_teardown(make: MakeSandbox, then: str) -> None:
    # In the working directory: the one folder both sides see (a namespace sandbox hides /tmp).
    async with make(SandboxLimits(wall_timeout_s=3)) as box:
        await box.start([PY, "-c", DAEMON, "lock", "pid", then], ENV)
        result = await box.wait()
        pid = (box.workdir / "pid").read_text()
        lock = (box.workdir / "lock").open("a")  # kept open past the folder's removal
    assert result.timed_out == (then == "hang"), result.stderr
    assert pid.isdigit()  # the daemon did start
    with lock:
        assert lock_is_free(lock)  # and no process holds its lock any more
    if make is LocalSandbox:
        assert is_gone(int(pid))


# Starts up to 60 children that each sleep (bounded: never a fork bomb); prints how many started.
SLEEPERS = """
import os, time
started = 0
for _ in range(60):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    started += 1
print(started)
"""


@pytest.mark.parametrize("kind", [LocalSandbox, NamespaceSandbox])
async def test_the_process_limit_binds_where_a_pids_cgroup_can_be_made(
    kind: type[LocalSandbox],
) -> None:
    async with kind(SandboxLimits(processes=20)) as box:
        await box.start([PY, "-c", SLEEPERS], ENV)
        made = box._cgroup
        result = await box.wait()
    assert 0 < int(result.stdout) <= 20, result.stdout
    if made is not None:  # made here, and removed with the sandbox
        assert not made.path.exists()


async def test_without_a_pids_cgroup_root_is_warned_that_the_limit_does_not_bind(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(cgroup, "MOUNTS", Path("/dev/null"))
    local_sandbox._warn_process_limit_does_not_bind.cache_clear()  # warned once per process
    with caplog.at_level(logging.WARNING, logger="rollway.sandbox"):
        async with LocalSandbox(SandboxLimits(processes=20)) as box:
            await box.start([PY, "-c", SLEEPERS], ENV)
            result = await box.wait()
    warned = [r for r in caplog.records if "does not bind root" in r.getMessage()]
    if os.geteuid() == 0:
        assert len(warned) == 1 and int(result.stdout) == 60  # as docs/agents.md says: unbounded
    else:
        assert not warned and int(result.stdout) <= 20  # RLIMIT_NPROC binds other users


def test_a_pids_cgroup_is_made_where_the_cgroup_file_system_is_writable() -> None:
    made = cgroup.PidsCgroup.create(7)
    writable = any(
        os.access(parent, os.W_OK) for parent in cgroup.pids_parents()
    )  # root on this machine kind: cgroup v1's pids hierarchy
    assert (made is not None) == writable
    if made is not None:
        assert (made.path / "pids.max").read_text().strip() == "7"
        made.remove()
        assert not made.path.exists()


async def test_a_command_that_cannot_run_exits_127_with_the_reason(make: MakeSandbox) -> None:
    async with make(SandboxLimits()) as box:
        await box.start(["no-such-program-here"], ENV)
        result = await box.wait()
    assert result.exit_code == 127 and "no-such-program-here" in result.stderr
