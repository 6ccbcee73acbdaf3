"""A sandbox whose supervisor (rollway's machinery) is killed from outside fails as
infrastructure, naming the supervisor, and leaves no process; a program that dies by a signal
(killed from outside, or by itself) is still the program's exit. Each kind runs with and
without a pids cgroup."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rollway.errors import InfrastructureError
from rollway.sandbox import LocalSandbox, NamespaceSandbox, SandboxLimits, cgroup
from rollway.sandbox.base import Sandbox

from .test_local import ENV, PY, is_gone

MakeSandbox = Callable[[SandboxLimits], Sandbox]
# The program starts a child, says it is ready, and waits; told "self", it kills itself.
PROGRAM = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
if sys.argv[1:] == ["self"]:
    os.kill(os.getpid(), signal.SIGKILL)
open("ready", "w").close()
time.sleep(120)
"""


@pytest.fixture(params=["local", "local-without-cgroup", "namespace", "namespace-without-cgroup"])
def make(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> MakeSandbox:
    if request.param.endswith("-without-cgroup"):
        monkeypatch.setattr(cgroup, "MOUNTS", Path("/dev/null"))  # no cgroup file system
    return NamespaceSandbox if request.param.startswith("namespace") else LocalSandbox


def children(pid: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue
        if stat and int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def tree(pid: int) -> list[int]:
    """``pid`` and every process below it (host pids)."""
    found, stack = [], [pid]
    while stack:
        found.append(top := stack.pop())
        stack += children(top)
    return found


async def started(box: Sandbox) -> tuple[int, list[int]]:
    """The supervisor's host pid and its whole tree, once the program said it is ready."""
    client_child = box._process.pid  # type: ignore[attr-defined]
    deadline = time.monotonic() + 30
    while not (box.workdir / "ready").exists():
        assert time.monotonic() < deadline, "the program never started"
        await asyncio.sleep(0.02)
    # In a namespace sandbox the supervisor is unshare's child, the namespaces' first process.
    namespaced = isinstance(box, NamespaceSandbox)
    (supervisor,) = children(client_child) if namespaced else [client_child]
    return supervisor, tree(supervisor)


async def test_a_killed_supervisor_is_an_infrastructure_failure_that_leaves_no_process(
    make: MakeSandbox,
) -> None:
    """Before, it was the program's exit: -9 (local; its program and child left running
    without a cgroup), or 1 with ``unshare: sigprocmask unblock failed`` (namespace)."""
    async with make(SandboxLimits()) as box:
        await box.start([PY, "-c", PROGRAM], ENV)
        supervisor, processes = await started(box)
        assert len(processes) == 3  # the supervisor, the program, its child
        os.kill(supervisor, signal.SIGKILL)
        with pytest.raises(InfrastructureError, match="supervisor") as raised:
            await box.wait()
        assert "before it wrote the program's exit status" in str(raised.value)
        assert all(is_gone(pid) for pid in processes)


@pytest.mark.parametrize("killer", ["outside", "self"])
async def test_a_program_killed_by_a_signal_is_the_programs_exit(
    make: MakeSandbox, killer: str
) -> None:
    async with make(SandboxLimits()) as box:
        await box.start([PY, "-c", PROGRAM, killer], ENV)
        if killer == "outside":
            supervisor, processes = await started(box)
            (program,) = children(supervisor)
            os.kill(program, signal.SIGKILL)
            result = await box.wait()
            assert all(is_gone(pid) for pid in processes)
        else:
            result = await box.wait()
        assert result.exit_code == -9
