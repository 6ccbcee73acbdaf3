"""The sandbox seam: run a command in the background, wait or poll, read its output and the
files it left in its working directory, run further commands there, destroy.

``destroy`` is always safe to call (any number of times, whatever state the sandbox is in) and
must leave nothing behind; callers call it on every path, and record what it raises instead of
raising it over the rollout's result.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """Resource limits; None leaves one unset."""

    wall_timeout_s: float | None = 600.0
    cpu_seconds: int | None = 600
    memory_bytes: int | None = 4 * 1024**3
    open_files: int | None = 1024
    #: Tasks (threads count) at once: a pids cgroup where one can be made, else
    #: RLIMIT_NPROC, which counts all of the user's tasks and does not bind root.
    processes: int | None = 256
    file_size_bytes: int | None = 1024**3
    #: Of each of stdout and stderr, the last this many bytes are kept (``*_truncated`` says
    #: whether there was more).
    output_bytes: int = 1024 * 1024
    #: The most bytes read back of a file the program leaves (the program agent's result
    #: file); a bigger one is the program's error. ``rollway.sandbox.readback``.
    result_bytes: int = 4 * 1024 * 1024
    #: Namespace sandbox: host paths (absolute, existing) the program may write besides its
    #: working directory; the rest of the host's file system is read-only there.
    writable_paths: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SandboxResult:
    """How the command ended. ``exit_code`` is negative for a signal (-9 for SIGKILL)."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    wall_s: float
    stdout_truncated: bool = False
    stderr_truncated: bool = False


class Sandbox(ABC):
    """One command's isolated run. Use as ``async with`` to get ``destroy`` on every path."""

    workdir: Path

    @abstractmethod
    async def start(
        self, command: Sequence[str], env: Mapping[str, str], stdin: bytes = b""
    ) -> None:
        """Start ``command`` in the background with exactly ``env`` and ``stdin``."""

    @abstractmethod
    def poll(self) -> SandboxResult | None:
        """The result if the command has ended, else None (raises as ``wait`` does)."""

    @abstractmethod
    async def wait(self) -> SandboxResult:
        """Wait for the end; past the wall-clock limit the whole process tree is killed. An
        ``InfrastructureError`` if the sandbox's own machinery died before it could say how the
        command ended (its supervisor killed: ``supervisor_death``), not the command's exit."""

    @abstractmethod
    def read_back(self, name: str, limit: int, what: str, setting: str = "") -> bytes | None:
        """The file ``name`` the command left in its working directory, read as
        ``rollway.sandbox.readback.read_back`` reads (None if there is none): in the folder the
        sandbox made, even if the command renamed it or put a link in its place."""

    async def run(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        *,
        stdin: bytes = b"",
        timeout_s: float | None = None,
    ) -> SandboxResult:
        """Run a further ``command`` once the first has ended, in the same working directory
        (the files it left there) under the same limits, its wall clock the shorter of
        ``wall_timeout_s`` and ``timeout_s``, and wait for it; cancelled, it ends the command's
        whole tree. What a reward that needs the environment runs (``RolloutEnvironment``)."""
        raise NotImplementedError(f"{type(self).__name__} runs no further command")

    @abstractmethod
    async def destroy(self) -> None:
        """Kill whatever still runs and remove the working directory."""

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.destroy()
