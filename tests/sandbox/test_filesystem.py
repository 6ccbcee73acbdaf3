"""A namespace sandbox's own view of the places where Unix sockets live: no host listener is
reachable (path-based under /tmp, /run, /dev/shm, nor abstract), the program cannot undo that,
and its working directory and the relay to the gateway's socket still work. The same program in
a local sandbox reaches every listener, which shows that each one is there to be reached."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollway.errors import ConfigError
from rollway.sandbox import LocalSandbox, NamespaceSandbox, SandboxLimits
from rollway.sandbox.base import Sandbox
from rollway.sandbox.namespace import HIDDEN_PLACES

from .test_local import ENV, PY

# Connects to each address given ("@name" is abstract) and says which it reached.
CONNECT = """
import socket, sys
for address in sys.argv[1:]:
    with socket.socket(socket.AF_UNIX) as sock:
        try:
            sock.connect("\\0" + address[1:] if address.startswith("@") else address)
            sock.sendall(b"hello")
            print("reached", address)
        except OSError as error:
            print("unreachable", address, error.strerror)
"""


@pytest.fixture
def host_listeners() -> Iterator[list[str]]:
    """Listening Unix sockets of the host: one in a folder of each writable socket place, and
    one in the abstract namespace."""
    made: list[tuple[socket.socket, str]] = []
    for place in ("/tmp", "/run", "/dev/shm"):
        if os.access(place, os.W_OK):
            path = os.path.join(tempfile.mkdtemp(dir=place, prefix="host-"), "listener.sock")
            made.append((socket.socket(socket.AF_UNIX), path))
    made.append((socket.socket(socket.AF_UNIX), f"@rollway-test-{uuid.uuid4().hex}"))
    for sock, address in made:
        sock.bind("\0" + address[1:] if address.startswith("@") else address)
        sock.listen()
    yield [address for _, address in made]
    for sock, address in made:
        sock.close()
        if not address.startswith("@"):
            shutil.rmtree(os.path.dirname(address))


async def run(kind: type[Sandbox], command: list[str], env: dict[str, str] = ENV) -> str:
    async with kind(SandboxLimits(wall_timeout_s=20)) as box:
        await box.start(command, env)
        result = await box.wait()
    assert result.exit_code == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize(
    ("kind", "expect"), [(LocalSandbox, "reached"), (NamespaceSandbox, "unreachable")]
)
async def test_a_namespace_sandbox_reaches_no_unix_socket_of_the_host(
    host_listeners: list[str], kind: type[Sandbox], expect: str
) -> None:
    assert host_listeners[0].startswith("/tmp/")
    lines = (await run(kind, [PY, "-c", CONNECT, *host_listeners])).splitlines()
    assert [line.split()[:2] for line in lines] == [[expect, a] for a in host_listeners]


# Tries to get back to the host's /tmp: unmount the tmpfs (here, and in a user and mount
# namespace of its own), go up from its directory or from the supervisor's; then connects.
UNDO = """
import ctypes, os, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
print("umount", libc.umount2(b"/tmp", 2))  # MNT_DETACH
nested = subprocess.run(["unshare", "--user", "--mount", "umount", "-l", "/tmp"])
print("nested umount", nested.returncode)
for path in ("..", "/proc/1/cwd/..", "/tmp"):
    try:
        print(path, os.path.basename(sys.argv[1]) in os.listdir(path))
    except OSError:
        print(path, False)
"""


async def test_the_program_cannot_undo_its_view_of_the_file_system(
    host_listeners: list[str],
) -> None:
    listener = host_listeners[0]  # under the host's /tmp
    lines = (await run(NamespaceSandbox, [PY, "-c", UNDO + CONNECT, listener])).splitlines()
    assert lines[0] == "umount -1" and lines[1] != "nested umount 0"
    assert lines[2:5] == [".. False", "/proc/1/cwd/.. False", "/tmp False"]
    assert lines[5].startswith(f"unreachable {listener}")


# Beside the relay: its own directory (the cwd, and under the hidden /tmp) works as before.
RELAY = """
import os, socket
with socket.create_connection(("127.0.0.1", int(os.environ["PORT"])), timeout=10) as sock:
    sock.sendall(b"ping")
    print(sock.recv(100).decode())
open("written", "w").write("ok")
print(open(os.path.join(os.environ["WORKDIR"], "written")).read())
"""


async def test_the_relay_reaches_the_gateway_socket_in_the_hidden_tmp() -> None:
    folder = tempfile.mkdtemp(dir="/tmp", prefix="gateway-")
    socket_path = os.path.join(folder, "gateway.sock")

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"pong:" + await reader.read(100))
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(echo, socket_path)
    with socket.socket() as probe:  # a free loopback port for the relay inside
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    try:
        async with NamespaceSandbox(SandboxLimits(wall_timeout_s=20)) as box:
            env = {
                **ENV, "PORT": str(port), "WORKDIR": str(box.workdir),
                "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
                "ROLLWAY_GATEWAY_SOCKET": socket_path,
            }  # fmt: skip
            await box.start([PY, "-c", RELAY], env)
            result = await box.wait()
            written = (box.workdir / "written").read_text()
    finally:
        server.close()
        await server.wait_closed()
        shutil.rmtree(folder)
    assert result.stdout.split() == ["pong:ping", "ok"], result.stderr
    assert written == "ok"


async def test_each_fresh_tmpfs_is_held_to_the_memory_limit() -> None:
    """A tmpfs is memory, which RLIMIT_AS does not count: /tmp must not fill the machine's."""
    script = "import os; print(*(os.statvfs(p).f_blocks * os.statvfs(p).f_frsize for p in P))"
    script = script.replace("P", "('/tmp', '/dev/shm')")
    limit = 512 * 1024**2
    async with NamespaceSandbox(SandboxLimits(memory_bytes=limit)) as box:
        await box.start([PY, "-c", script], ENV)
        result = await box.wait()
    assert result.stdout.split() == [str(limit)] * 2, result.stderr


# Writes where it is told; says which writes the file system refused.
WRITE = """
import sys
for path in sys.argv[1:]:
    try:
        with open(path, "w") as f:
            f.write("written")
        print("wrote", path)
    except OSError as error:
        print("refused", path, error.strerror)
"""


@pytest.fixture
def host_folder() -> Iterator[str]:
    """A folder of the host the caller may write, outside every hidden place."""
    folder = tempfile.mkdtemp(dir=os.path.expanduser("~"), prefix="rollway-host-")
    assert not folder.startswith(HIDDEN_PLACES) and os.access(folder, os.W_OK)
    yield folder
    shutil.rmtree(folder)


async def test_the_host_file_system_is_read_only_in_a_namespace_sandbox_by_default(
    host_folder: str,
) -> None:
    """Root in its user namespace is the caller to the host: it could write all the caller
    may write (as root, anywhere). Now only its own folder and its fresh mounts."""
    host_file = os.path.join(host_folder, "escaped")
    places = [host_file, "in-workdir", "/tmp/t", "/dev/shm/t", "/dev/null"]
    lines = (await run(NamespaceSandbox, [PY, "-c", WRITE, *places])).splitlines()
    assert lines == [f"refused {host_file} Read-only file system"] + [
        f"wrote {place}" for place in places[1:]
    ]
    assert os.listdir(host_folder) == []
    # The same program in a local sandbox writes it: the folder is there to be written.
    assert (await run(LocalSandbox, [PY, "-c", WRITE, host_file])).split() == ["wrote", host_file]


async def test_a_namespace_sandbox_writes_the_host_paths_its_limits_name(host_folder: str) -> None:
    shared = os.path.join(host_folder, "shared")
    os.mkdir(shared)
    written, refused = os.path.join(shared, "out"), os.path.join(host_folder, "out")
    async with NamespaceSandbox(SandboxLimits(wall_timeout_s=20, writable_paths=(shared,))) as box:
        await box.start([PY, "-c", WRITE, written, refused], ENV)
        result = await box.wait()
    assert result.stdout.splitlines() == [
        f"wrote {written}",
        f"refused {refused} Read-only file system",
    ], result.stderr
    assert await asyncio.to_thread(Path(written).read_text) == "written"


@pytest.mark.parametrize("path", ["relative/folder", "/no/such/folder"])
def test_a_writable_path_must_be_an_existing_folders_absolute_path(path: str) -> None:
    with pytest.raises(ConfigError, match=r"SandboxLimits.writable_paths: .*folder"):
        NamespaceSandbox(SandboxLimits(writable_paths=(path,)))
