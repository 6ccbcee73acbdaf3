"""The local and namespace sandboxes with real processes: output, limits, timeouts, and nothing
left behind (both), network and process isolation (namespace)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

import pytest

from rollway.sandbox import SANDBOXES, LocalSandbox, NamespaceSandbox, SandboxLimits
from rollway.sandbox.base import Sandbox

PY = sys.executable
ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


@pytest.fixture(params=sorted(SANDBOXES))
def make(request: pytest.FixtureRequest) -> type[Sandbox]:
    """Each sandbox kind in turn (the namespace one on this Linux machine kind always)."""
    return SANDBOXES[request.param]


def is_gone(pid: int) -> bool:
    """Dead or a zombie waiting for its (re)parent: either way it runs no more."""
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "State:\tZ" in state


async def test_runs_a_command_with_env_stdin_and_a_fresh_workdir(make: type[Sandbox]) -> None:
    async with make() as box:
        script = "import os,sys; print(os.environ['TASK'], sys.stdin.read(), os.getcwd())"
        await box.start([PY, "-c", script], {**ENV, "TASK": "t1"}, stdin=b"hello")
        result = await box.wait()
        workdir = box.workdir
    assert result.exit_code == 0 and not result.timed_out
    assert result.stdout.split() == ["t1", "hello", str(workdir)]
    assert not workdir.exists()  # destroyed with the sandbox


async def test_the_program_gets_exactly_the_environment_given(make: type[Sandbox]) -> None:
    async with make() as box:  # no LC_CTYPE from a Python on the way, for one
        await box.start(["env"], {**ENV, "TASK": "t1"})
        result = await box.wait()
    assert sorted(result.stdout.split()) == sorted(
        f"{k}={v}" for k, v in {**ENV, "TASK": "t1"}.items()
    )


async def test_a_program_that_never_reads_its_stdin_cannot_hold_up_the_start(
    make: type[Sandbox],
) -> None:
    async with make(SandboxLimits(wall_timeout_s=1)) as box:
        big = b"x" * 1_000_000  # far more than a pipe holds
        await asyncio.wait_for(box.start([PY, "-c", "import time; time.sleep(600)"], ENV, big), 10)
        result = await box.wait()
    assert result.timed_out


async def test_exit_codes_and_stderr_are_recorded(make: type[Sandbox]) -> None:
    async with make() as box:
        await box.start([PY, "-c", "import sys; sys.stderr.write('boom'); sys.exit(3)"], ENV)
        result = await box.wait()
    assert result.exit_code == 3 and result.stderr == "boom"
    assert box.poll() == result


async def test_output_is_bounded_and_the_child_never_blocks(make: type[Sandbox]) -> None:
    async with make(SandboxLimits(output_bytes=1000)) as box:
        await box.start([PY, "-c", "print('x' * 5_000_000 + 'the end')"], ENV)
        result = await box.wait()
    assert result.exit_code == 0 and len(result.stdout) == 1000 and result.stdout_truncated
    assert result.stdout.endswith("xthe end\n")  # the tail, where an error's cause is


async def test_each_capture_keeps_a_bounded_tail_by_default(make: type[Sandbox]) -> None:
    script = "import sys; sys.stderr.write('x' * 3_000_000 + 'Traceback: the cause')"
    async with make() as box:
        await box.start([PY, "-c", script], ENV)
        result = await box.wait()
    assert len(result.stderr) == SandboxLimits().output_bytes == 1024**2
    assert result.stderr_truncated and result.stderr.endswith("xTraceback: the cause")


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
async def test_a_program_that_replaces_its_exit_status_file_cannot_block_or_fool_the_sandbox(
    make: type[Sandbox], kind: str, tmp_path: Path
) -> None:
    """The supervisor leaves the exit code in the working directory, where the program may
    leave anything: a FIFO blocked both ends for good, a link was followed."""
    target = tmp_path / "elsewhere"
    target.write_text("0")
    make_it = (
        "os.mkfifo('.rollway-exit-code')"
        if kind == "fifo"
        else f"os.symlink({str(target)!r}, '.rollway-exit-code')"
    )
    async with make() as box:
        await box.start([PY, "-c", f"import os, sys; {make_it}; sys.exit(5)"], ENV)
        result = await asyncio.wait_for(box.wait(), 30)
    assert (result.exit_code, result.timed_out) == (5, False), result.stderr
    assert target.read_text() == "0"  # not written through the link


# Moves its folder aside and leaves a link to the victim's folder in its place (the local
# sandbox lets it; in the namespace sandbox the folder is a mount point, which cannot be moved).
SWAPS_ITS_FOLDER = """
import os, sys
open("result.json", "w").write("mine")
d = os.getcwd()
try:
    os.rename(d, d + ".moved")
    os.symlink(sys.argv[1], d)
except OSError as error:
    print("resisted:", error)
sys.exit(5)
"""


@pytest.mark.timeout(60, method="thread")
async def test_a_program_that_swaps_its_folder_for_a_link_redirects_nothing(
    make: type[Sandbox], tmp_path: Path
) -> None:
    """The client read the victim's files, the supervisor wrote its exit status there, and the
    link (and the moved folder) outlived the teardown."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "result.json").write_text("theirs")
    async with make() as box:
        workdir = box.workdir
        await box.start([PY, "-c", SWAPS_ITS_FOLDER, str(victim)], ENV)
        result = await box.wait()
        read = box.read_back("result.json", 100, "result file")
    assert result.exit_code == 5, result.stderr
    assert read == b"mine"  # from the folder the sandbox made, wherever it is now
    assert sorted(p.name for p in victim.iterdir()) == ["result.json"]  # no exit status
    assert (victim / "result.json").read_text() == "theirs"
    moved = workdir.with_name(workdir.name + ".moved")
    assert not workdir.is_symlink() and not workdir.exists()  # neither the link
    assert not moved.exists()  # nor the folder it took the place of


async def test_wall_timeout_kills_forked_children_and_sigterm_ignorers(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = f"""
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
children = []
for _ in range(3):
    child = os.fork()
    if child == 0:
        time.sleep(600)
        os._exit(0)
    children.append(child)
with open({str(pids)!r}, "w") as f:
    f.write(" ".join(str(p) for p in [os.getpid(), *children]))
time.sleep(600)
"""
    async with LocalSandbox(SandboxLimits(wall_timeout_s=1.0)) as box:
        await box.start([PY, "-c", script], ENV)
        result = await box.wait()
        group = box._process.pid
    assert result.timed_out and result.exit_code == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)  # the whole group is gone (or only zombies)
    recorded = [int(p) for p in pids.read_text().split()]
    assert len(recorded) == 4 and all(is_gone(p) for p in recorded)


async def test_destroy_mid_run_leaves_no_process(make: type[Sandbox]) -> None:
    box = make()
    await box.start([PY, "-c", "import os,time; os.fork(); time.sleep(600)"], ENV)
    group = box._process.pid
    assert box.poll() is None
    await box.destroy()
    await box.destroy()  # idempotent
    with pytest.raises(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)


@pytest.mark.parametrize(
    ("limits", "script", "expect"),
    [
        (SandboxLimits(cpu_seconds=1), "while True: pass", -signal.SIGXCPU),
        (
            SandboxLimits(memory_bytes=300 * 1024**2),
            "b = bytearray(1024**3)",
            1,  # MemoryError
        ),
        (
            SandboxLimits(file_size_bytes=1024),
            "open('big', 'wb').write(b'x' * 100_000)",
            1,  # Python ignores SIGXFSZ: the write fails with EFBIG
        ),
        (
            SandboxLimits(open_files=16),
            "fs = [open('f%d' % i, 'w') for i in range(64)]",
            1,  # OSError: too many open files
        ),
    ],
)
async def test_resource_limits_are_enforced(
    make: type[Sandbox], limits: SandboxLimits, script: str, expect: int
) -> None:
    async with make(limits) as box:
        await box.start([PY, "-c", script], ENV)
        result = await box.wait()
    assert result.exit_code == expect, result.stderr[-500:]


async def test_a_namespace_sandbox_times_out_and_leaves_no_process() -> None:
    script = (
        "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); os.fork();"
        " time.sleep(600)"
    )
    async with NamespaceSandbox(SandboxLimits(wall_timeout_s=1.0)) as box:
        await box.start([PY, "-c", script], ENV)
        result = await box.wait()
        group = box._process.pid
    assert result.timed_out
    with pytest.raises(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)


async def test_a_namespace_sandbox_has_no_network_and_sees_no_other_process() -> None:
    script = """
import os, socket
print(len([p for p in os.listdir('/proc') if p.isdigit()]))
try:
    os.kill(PARENT, 0)
    print("parent visible")
except ProcessLookupError:
    print("parent hidden")
for host in ("127.0.0.1", "1.1.1.1"):
    try:
        socket.create_connection((host, PORT), timeout=2)
        print("reached", host)
    except OSError:
        print("unreachable", host)
"""
    with socket.socket() as listener:  # a service on the host's loopback
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code = script.replace("PARENT", str(os.getpid())).replace("PORT", str(port))
        for kind, expect in ((LocalSandbox, "reached"), (NamespaceSandbox, "unreachable")):
            async with kind() as box:
                await box.start([PY, "-c", code], ENV)
                result = await box.wait()
            lines = result.stdout.split("\n")
            assert lines[2] == f"{expect} 127.0.0.1", (kind, result.stderr)
            if kind is NamespaceSandbox:
                # the supervisor (which relays) and the program; the caller is out of sight
                assert lines[:2] == ["2", "parent hidden"] and lines[3] == "unreachable 1.1.1.1"
