"""Nothing of a sandbox outlives its client, however the client ends (SIGKILL included): the
supervisor watches a pipe only the client holds, and has the client's death as a signal too.
What a killed client leaves in the temp dir (sandbox folders, gateway-socket folders, empty
pids cgroups) is removed by the next client that opens, and only that."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rollway.agents.program import ProgramAgent
from rollway.client import RolloutClient
from rollway.engines.sim import SimConfig, SimEngine
from rollway.gateway import Gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.sandbox import SANDBOXES, SandboxLimits, remove_leftovers
from rollway.sandbox.base import Sandbox
from rollway.tempdirs import OWNER_FILE, make_owned_tempdir

from .test_local import ENV, PY

# A program that forks, so that each sandbox holds a tree: the program and its child.
PROGRAM = "import os, sys, time; os.fork(); time.sleep(600)"

# A client as `rollway run` holds its sandboxes: started from the event loop's own thread
# (LoopThread), beside a gateway served on a Unix socket. Prints what it made, then waits to be
# killed; with "copy", a forked copy of it first keeps every pipe of the client open.
CLIENT = """
import json, os, sys, time
from rollway.loop_thread import LoopThread
from rollway.sandbox import SANDBOXES, SandboxLimits
from rollway.web.background_server import LoopServer

kind, program, marker, copy = sys.argv[1:]

async def start_sandboxes():
    boxes = [SANDBOXES[kind](SandboxLimits()) for _ in range(4)]
    for box in boxes:
        await box.start([sys.executable, "-c", program, marker], {"PATH": os.environ["PATH"]})
    return boxes

server = LoopServer(lambda scope, receive, send: None, unix_socket=True)
boxes = LoopThread().call(start_sandboxes())
left = [str(box.workdir) for box in boxes] + [os.path.dirname(server.unix_path)]
left += [str(box._cgroup.path) for box in boxes if box._cgroup is not None]
copy_pid = os.fork() if copy == "copy" else None
if copy_pid == 0:
    time.sleep(600)
    os._exit(0)
print(json.dumps({"left": left, "copy": copy_pid}), flush=True)
time.sleep(600)
"""


def marked(marker: str) -> list[int]:
    """Every live process whose command line holds ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
                if state != "Z":
                    found.append(int(entry.name))
        except OSError:  # ended meanwhile
            continue
    return found


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``condition`` (nothing signals a process's end to a non-parent) until the timeout."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def kill_on_exit() -> Iterator[list[int]]:
    """Pids to SIGKILL at the end of the test, whatever happened."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("copy", ["alone", "copy"])
@pytest.mark.parametrize("kind", sorted(SANDBOXES))
def test_no_process_of_a_killed_clients_sandboxes_outlives_it(
    kind: str, copy: str, kill_on_exit: list[int]
) -> None:
    marker = f"rollway-test-{uuid.uuid4().hex}"
    client = subprocess.Popen(
        [PY, "-c", CLIENT, kind, PROGRAM, marker, copy], stdout=subprocess.PIPE, text=True
    )
    kill_on_exit.append(client.pid)
    assert client.stdout is not None
    with client.stdout:
        made = json.loads(client.stdout.readline())  # once its four sandboxes have started
    if made["copy"] is not None:
        kill_on_exit.append(made["copy"])
    ours = {client.pid, made["copy"]}

    def sandboxed() -> list[int]:
        return [pid for pid in marked(marker) if pid not in ours]

    # Per sandbox: the supervisor, the program and its child (and unshare, in a namespace one).
    per_sandbox = 4 if kind == "namespace" else 3
    assert wait_until(lambda: len(sandboxed()) == 4 * per_sandbox), sandboxed()
    client.kill()
    client.wait()
    assert wait_until(lambda: not sandboxed(), timeout=5.0), sandboxed()
    # What stays until the next client opens: marked as the dead client's, so that one removes it.
    left = [Path(path) for path in made["left"]]
    assert all(path.exists() for path in left)
    owned = [path for path in left if (path / OWNER_FILE).exists()]
    assert len(owned) == 5  # the four working directories and the gateway's socket folder
    assert all(f".{client.pid}." in (path / OWNER_FILE).read_text() for path in owned)
    # A pids cgroup holds its exited processes until they are reaped (init adopts them): rmdir
    # refuses it until then, so a next client opening a moment earlier leaves it for the next.
    removed: list[Path] = []

    def all_removed() -> bool:
        removed.extend(remove_leftovers())
        return set(left) <= set(removed)

    assert wait_until(all_removed, timeout=5.0), sorted(set(left) - set(removed))
    assert not any(path.exists() for path in left)


@pytest.fixture(params=sorted(SANDBOXES))
def make(request: pytest.FixtureRequest) -> type[Sandbox]:
    return SANDBOXES[request.param]


async def test_a_sandbox_ends_when_its_clients_lifeline_closes(make: type[Sandbox]) -> None:
    async with make(SandboxLimits(wall_timeout_s=30)) as box:
        await box.start([PY, "-c", "import time; time.sleep(600)"], ENV)
        assert box.poll() is None
        os.close(box._lifeline)  # what the kernel does when the client dies, however
        box._lifeline = None
        result = await asyncio.wait_for(box.wait(), 10)
    assert result.exit_code == -signal.SIGTERM and not result.timed_out


LEAVE_AND_DIE = """
import os
from rollway.sandbox import LocalSandbox
from rollway.web.background_server import LoopServer

box = LocalSandbox()
server = LoopServer(lambda scope, receive, send: None, unix_socket=True)
print(box.workdir, os.path.dirname(server.unix_path), flush=True)
os._exit(0)  # as a killed client: nothing torn down
"""


def test_a_client_that_opens_removes_what_ended_clients_left_and_nothing_else(
    renderer: ChatRenderer, tmp_path: Path
) -> None:
    ended = subprocess.run([PY, "-c", LEAVE_AND_DIE], capture_output=True, text=True, timeout=60)
    left = [Path(path) for path in ended.stdout.split()]
    assert len(left) == 2 and all(path.is_dir() for path in left), ended.stderr
    live = make_owned_tempdir("rollway-sandbox-")  # this process's: alive
    unmarked = Path(os.path.join(os.path.dirname(live), f"rollway-unmarked-{uuid.uuid4().hex}"))
    unmarked.mkdir()
    try:
        gateway = Gateway(SimEngine(SimConfig()), renderer, model_name="sim")
        with RolloutClient(ProgramAgent(["true"]), gateway, store=str(tmp_path)):
            assert not any(path.exists() for path in left)
            assert live.is_dir() and unmarked.is_dir()
    finally:
        for path in (live, unmarked):
            (path / OWNER_FILE).unlink(missing_ok=True)
            path.rmdir()
