"""A namespace sandbox: the local sandbox's limits and teardown, plus Linux namespaces made by
util-linux ``unshare`` (no root needed: a user namespace maps the caller to root inside).

What it adds: its own network namespace whose only way out is a relay from
``127.0.0.1:<gateway port>`` to the gateway's Unix socket (so ``OPENAI_BASE_URL`` works
unchanged and nothing else is reachable: no internet, no other local service); its own PID
namespace (it cannot see or signal other processes, and when its first process dies every
process in it dies); its own IPC and hostname. What it does not: the file system (shared with
the caller apart from a private ``/proc``; use a container runtime for that), CPU and memory
beyond the rlimits, kernel attack surface.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlparse

from rollway.errors import ConfigError
from rollway.sandbox.base import SandboxLimits
from rollway.sandbox.local import LocalSandbox, isolated_python

_UNSHARE = [
    "unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--mount-proc",
    "--ipc", "--uts", "--kill-child",
]  # fmt: skip
_RELAY = Path(__file__).with_name("relay.py")


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
        """unshare, then the relay as the namespaces' first process, then the supervisor."""
        relay = isolated_python(_RELAY)
        socket_path = env.get("ROLLWAY_GATEWAY_SOCKET")
        port = urlparse(env.get("OPENAI_BASE_URL", "")).port
        if socket_path and port:
            relay += ["--port", str(port), "--unix", socket_path]
        return [*_UNSHARE, *relay, "--", *super()._wrap(command, env)]
