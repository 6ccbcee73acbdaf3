"""A namespace sandbox: the local sandbox's limits and teardown, plus Linux namespaces made by
util-linux ``unshare`` (no root needed: a user namespace maps the caller to root inside).

What it adds: its own network namespace whose only way out is a relay from
``127.0.0.1:<gateway port>`` to the gateway's Unix socket (so ``OPENAI_BASE_URL`` works
unchanged and nothing else is reachable: no internet, no other local service); its own PID
namespace (it cannot see or signal other processes, and when its first process dies every
process in it dies); its own IPC and hostname; its own view of the places where Unix sockets
and shared memory live (a fresh tmpfs over ``/tmp``, ``/run``, ``/dev/shm``, ``/var/tmp``, with
its working directory and the gateway's socket folder bound back: ``filesystem.py``), and its
abstract Unix sockets are its network namespace's; the rest of the host's file system read-only
(every mount; Linux 5.12 or later), but for its working directory, the folders named in
``SandboxLimits.writable_paths``, and those fresh mounts. What it does not: hide the rest of the
file system (the program reads what the caller may read; use a container runtime for that), CPU
and memory beyond the rlimits, kernel attack surface. A program (or interpreter) under those
places is not visible inside. The process limit is the local sandbox's: to the kernel the
program is still the caller (root stays root), so as root only a pids cgroup binds it.

Inside: unshare, then the supervisor as the namespaces' first process, running the relay.
When the client dies, unshare gets SIGKILL (its parent-death signal) and takes the supervisor,
and so the whole PID namespace, with it (``--kill-child``).
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from urllib.parse import urlparse

from rollway.errors import ConfigError
from rollway.sandbox.base import SandboxLimits
from rollway.sandbox.local_sandbox import LocalSandbox
from rollway.sandbox.supervisor_death import namespace_death

_UNSHARE = [
    "unshare",
    "--user",
    "--map-root-user",
    "--net",
    "--pid",
    "--fork",
    "--mount-proc",
    "--ipc",
    "--uts",
    "--kill-child",
]
#: Where programs find other programs' Unix sockets and shared memory: a fresh tmpfs over each.
HIDDEN_PLACES = ("/tmp", "/run", "/dev/shm", "/var/tmp")


@functools.cache
def namespaces_available() -> bool:
    """Whether this machine lets an unprivileged process make the namespaces (checked once)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run([*_UNSHARE, "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


class NamespaceSandbox(LocalSandbox):
    # unshare ignores SIGTERM; its death kills the namespace, and every process in it, at once.
    _ORPHAN_SIGNAL = signal.SIGKILL

    def __init__(self, limits: SandboxLimits | None = None) -> None:
        if not namespaces_available():
            raise ConfigError(
                "namespace sandboxes need util-linux `unshare` and unprivileged user namespaces"
            )
        for path in (limits or SandboxLimits()).writable_paths:
            if not os.path.isabs(path) or not os.path.isdir(path):
                raise ConfigError(
                    f"SandboxLimits.writable_paths: {path!r} is not an existing folder's"
                    " absolute path: name folders that exist"
                )
        super().__init__(limits)

    def _wrap(self, command: Sequence[str], env: Mapping[str, str], lifeline: int) -> list[str]:
        return [*_UNSHARE, *super()._wrap(command, env, lifeline)]

    def _supervisor_death(self, stderr: str) -> str | None:
        assert self._process is not None and self._process.returncode is not None
        return namespace_death(self._process.returncode, stderr)

    def _supervisor_options(self, env: Mapping[str, str]) -> list[str]:
        """The relay, from ``127.0.0.1:<port of OPENAI_BASE_URL>`` to the gateway's socket; the
        socket places hidden, but for the working directory and the socket's folder."""
        socket_path = env.get("ROLLWAY_GATEWAY_SOCKET")
        port = urlparse(env.get("OPENAI_BASE_URL", "")).port
        relay = (
            ["--relay", "--port", str(port), "--unix", socket_path]
            if socket_path and port
            else ["--relay"]
        )
        writable = [str(self.workdir), *self.limits.writable_paths]
        keep = [*writable, *([os.path.dirname(socket_path)] if socket_path else [])]
        # Sorted, so a folder is bound back before any folder inside it.
        keep = sorted({*keep, *_runtime_dirs()})
        hide = [f"--hide={place}" for place in HIDDEN_PLACES]
        hide += [f"--writable={path}" for path in writable]
        # A tmpfs is memory: each one is held to the memory limit (files there are not counted
        # in RLIMIT_AS), so /tmp cannot fill the machine's memory.
        size = self.limits.memory_bytes
        hide += [f"--tmpfs-size={size}"] if size is not None else []
        return [*relay, *hide, *(f"--keep={path}" for path in keep)]


def _runtime_dirs() -> list[str]:
    """What the supervisor (and a Python program) needs to run, kept where a hidden place
    holds it: this interpreter's prefix and import path (a checkout or venv under /tmp)."""
    return [d for d in {sys.prefix, *sys.path} if os.path.isabs(d) and os.path.isdir(d)]
