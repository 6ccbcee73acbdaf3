"""A namespace sandbox: the local sandbox's limits and teardown, plus Linux namespaces made by
util-linux ``unshare`` (no root needed: a user namespace maps the caller to root inside).

What it adds: its own network namespace whose only way out is a relay from
``127.0.0.1:<gateway port>`` to the gateway's Unix socket (so ``OPENAI_BASE_URL`` works
unchanged and nothing else is reachable: no internet, no other local service); its own PID
namespace (it cannot see or signal other processes, and when its first process dies every
process in it dies); its own IPC and hostname. What it does not: the file system (shared with
the caller apart from a private ``/proc``; use a container runtime for that), CPU and memory
beyond the rlimits, kernel attack surface. The process limit is the local sandbox's: to the kernel
the program is still the caller (root stays root), so as root only a pids cgroup binds it.

Inside: unshare, then the supervisor as the namespaces' first process, running the relay.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from urllib.parse import urlparse

from rollway.errors import ConfigError
from rollway.sandbox.base import SandboxLimits
from rollway.sandbox.local_sandbox import LocalSandbox

_UNSHARE = [
    "unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--mount-proc",
    "--ipc", "--uts", "--kill-child",
]  # fmt: skip


@functools.cache
def namespaces_available() -> bool:
    """Whether this machine lets an unprivileged process make the namespaces (checked once)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run([*_UNSHARE, "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


class NamespaceSandbox(LocalSandbox):
    def __init__(self, limits: SandboxLimits | None = None) -> None:
        if not namespaces_available():
            raise ConfigError(
                "namespace sandboxes need util-linux `unshare` and unprivileged user namespaces"
            )
        super().__init__(limits)

    def _wrap(self, command: Sequence[str], env: Mapping[str, str]) -> list[str]:
        return [*_UNSHARE, *super()._wrap(command, env)]

    def _supervisor_options(self, env: Mapping[str, str]) -> list[str]:
        """The relay: from ``127.0.0.1:<port of OPENAI_BASE_URL>`` to the gateway's socket."""
        socket_path = env.get("ROLLWAY_GATEWAY_SOCKET")
        port = urlparse(env.get("OPENAI_BASE_URL", "")).port
        if socket_path and port:
            return ["--relay", "--port", str(port), "--unix", socket_path]
        return ["--relay"]
